// A page loaded on demand (the console and the replay player carry xterm.js and the
// asciinema player, kept out of the first load).
import type { FunctionComponent } from "preact";
import { useEffect, useState } from "preact/hooks";
import { ErrorNote, Loading } from "./ui";

type Module<P> = { default: FunctionComponent<P> };

export function Lazy<P extends object>({ load, props }: { load: () => Promise<Module<P>>; props: P }) {
  const [component, setComponent] = useState<FunctionComponent<P> | null>(null);
  const [error, setError] = useState<unknown>(null);
  useEffect(() => {
    load().then((module) => setComponent(() => module.default), setError);
  }, []);
  if (error) return <ErrorNote error={error} />;
  if (!component) return <Loading what="the page" />;
  const Component = component;
  return <Component {...props} />;
}
