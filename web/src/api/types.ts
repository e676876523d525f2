// The API's types by schema name, from the document's generated types (schema.d.ts). A leaf:
// it imports nothing of the dashboard's, so the session and the client can both use it.
import type { components } from "./schema";

export type S<K extends keyof components["schemas"]> = components["schemas"][K];
export type ErrorBody = S<"ErrorBody">;
