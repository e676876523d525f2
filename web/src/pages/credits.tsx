// Credits: the balance and its grants (with expiry), the ledger page by page, and top-ups
// through Stripe Checkout. After paying, Stripe sends the buyer to /billing/success, which
// follows the balance until the webhook's credits arrive.
import { useEffect, useState } from "preact/hooks";
import { api, ok } from "../api/client";
import { ErrorNote, Field, Loading, Page, Pager, credits, fields, useAction, useLoad, usePages, when } from "../ui";

const PENDING = "sandbase.checkout";

function TopUp({ before }: { before: number | undefined }) {
  const { error, busy, run } = useAction();
  const submit = (event: Event) => {
    const { get } = fields(event);
    return run(async () => {
      const answer = ok(await api.POST("/v1/billing/checkout", { body: { credits: Number(get("credits")) } }));
      sessionStorage.setItem(PENDING, JSON.stringify({ session_id: answer.session_id, before: before ?? 0 }));
      location.assign(answer.url);
    });
  };
  return (
    <form class="panel form-grid" onSubmit={submit} aria-label="Buy credits">
      <h2>Buy credits</h2>
      <Field label="Credits" hint="Paid on Stripe's Checkout page.">
        <input name="credits" type="number" min={1} step={1} value={20} required />
      </Field>
      <ErrorNote error={error} />
      <button type="submit" disabled={busy}>
        Continue to payment
      </button>
    </form>
  );
}

function Ledger() {
  const pages = usePages();
  const before = pages.cursor;
  const page = useLoad(async () => ok(await api.GET("/v1/billing/ledger", { params: { query: { before, limit: 20 } } })), [before]);
  return (
    <div class="panel">
      <h2>Ledger</h2>
      <ErrorNote error={page.error} />
      {!page.data ? (
        <Loading what="the ledger" />
      ) : (
        <>
          <table>
            <thead>
              <tr>
                <th>When</th>
                <th>Kind</th>
                <th>What</th>
                <th class="number">Credits</th>
              </tr>
            </thead>
            <tbody>
              {page.data.transactions.map((transaction) => (
                <tr>
                  <td>{when(transaction.created_at)}</td>
                  <td>{transaction.kind}</td>
                  <td>{transaction.description}</td>
                  <td class="number">{transaction.amount}</td>
                </tr>
              ))}
            </tbody>
          </table>
          <Pager pages={pages} next={page.data.next_cursor} />
        </>
      )}
    </div>
  );
}

export function Credits({ cancelled = false }: { cancelled?: boolean }) {
  const balance = useLoad(async () => ok(await api.GET("/v1/billing/balance")), [], 15_000);
  return (
    <Page title="Credits">
      {cancelled ? <p role="status">Payment cancelled: nothing was charged.</p> : null}
      <ErrorNote error={balance.error} />
      <div class="tiles">
        <div class="tile">
          <span class="muted">Available</span>
          <strong data-testid="balance">{balance.data?.available ?? "…"}</strong>
        </div>
        <div class="tile">
          <span class="muted">Reserved by running work</span>
          <strong>{balance.data?.reserved ?? "0"}</strong>
        </div>
      </div>
      <TopUp before={balance.data?.available_micro} />
      <div class="panel">
        <h2>Grants</h2>
        {!balance.data ? (
          <Loading what="grants" />
        ) : (
          <table>
            <thead>
              <tr>
                <th>Source</th>
                <th class="number">Granted</th>
                <th class="number">Left</th>
                <th>From</th>
                <th>Expires</th>
              </tr>
            </thead>
            <tbody>
              {balance.data.grants.map((grant) => (
                <tr class={grant.expired ? "muted" : ""}>
                  <td>{grant.source}</td>
                  <td class="number">{credits(grant.amount_micro)}</td>
                  <td class="number">{credits(grant.remaining_micro)}</td>
                  <td>{when(grant.effective_at)}</td>
                  <td>{grant.expired ? "expired" : when(grant.expires_at)}</td>
                </tr>
              ))}
            </tbody>
          </table>
        )}
      </div>
      <Ledger />
    </Page>
  );
}

/// Stripe's return page: the payment is made, the credits come with Stripe's webhook; the
/// balance is followed (twice a second, two minutes at most) until they are there.
export function CheckoutReturn() {
  const pending = JSON.parse(sessionStorage.getItem(PENDING) ?? "null") as { before: number } | null;
  const [arrived, setArrived] = useState<string | null>(null);
  const [waited, setWaited] = useState(0);
  useEffect(() => {
    if (arrived) return;
    const timer = setTimeout(async () => {
      const balance = ok(await api.GET("/v1/billing/balance"));
      if (!pending || balance.available_micro > pending.before) {
        sessionStorage.removeItem(PENDING);
        setArrived(balance.available);
      } else {
        setWaited((n) => n + 1);
      }
    }, waited === 0 ? 0 : 500);
    return () => clearTimeout(timer);
  }, [waited, arrived]);
  return (
    <Page title="Payment received">
      {arrived ? (
        <p role="status" data-testid="arrived">
          Your credits have arrived. Balance: <strong data-testid="balance">{arrived}</strong>. <a href="/credits">Credits</a>
        </p>
      ) : waited > 240 ? (
        <p role="alert">The payment went through but the credits have not arrived yet; they will appear on the Credits page when Stripe tells us.</p>
      ) : (
        <p role="status">Waiting for the payment to be confirmed… ({Math.floor(waited / 2)} s)</p>
      )}
    </Page>
  );
}
