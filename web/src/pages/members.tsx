// Members: invitations (by e-mail; they join when they accept), roles, removal. Only owners
// and admins see those actions (the API refuses them to members anyway); removing or
// demoting the last owner is refused with a clear message. Invitations to the user's own
// address are accepted here too.
import { useState } from "preact/hooks";
import { ApiFailure, api, ok, type S } from "../api/client";
import { isAdmin, session } from "../session";
import { ActionsHead, ErrorNote, Field, Loading, Page, fields, useAction, useLoad, when } from "../ui";

function explain(failure: unknown): unknown {
  if (failure instanceof ApiFailure && failure.code === "last_owner") {
    return new Error("A team always keeps an owner: make someone else an owner first, then change or remove this one.");
  }
  return failure;
}

function Invite({ onDone }: { onDone: () => void }) {
  const { error, run } = useAction();
  const [sent, setSent] = useState<string | null>(null);
  const submit = (event: Event) => {
    const { form, get } = fields(event);
    return run(async () => {
      const invitation = ok(await api.POST("/v1/team/members", { body: { email: get("email"), role: get("role") as S<"Role"> } }));
      setSent(invitation.email);
      form.reset();
      onDone();
    });
  };
  return (
    <form class="panel form-grid" onSubmit={submit} aria-label="Invite a member">
      <h2>Invite</h2>
      <Field label="E-mail">
        <input name="email" type="email" required />
      </Field>
      <Field label="Role">
        <select name="role">
          <option value="member">member</option>
          <option value="admin">admin</option>
          {session()?.role === "owner" ? <option value="owner">owner</option> : null}
        </select>
      </Field>
      <ErrorNote error={error} />
      {sent ? <p role="status">Invitation sent to {sent}.</p> : null}
      <button type="submit">Invite</button>
    </form>
  );
}

function MyInvitations() {
  const mine = useLoad(async () => ok(await api.GET("/v1/invitations")), []);
  const { error, run } = useAction();
  const items = mine.data?.items ?? [];
  if (!items.length) return null;
  return (
    <div class="panel">
      <h2>Invitations for you</h2>
      <ErrorNote error={error} />
      <ul>
        {items.map((invitation) => (
          <li>
            {invitation.team.name} as {invitation.role}{" "}
            <button
              type="button"
              onClick={() =>
                run(async () => {
                  ok(await api.POST("/v1/invitations/{id}/accept", { params: { path: { id: invitation.id } } }));
                  mine.reload();
                })
              }
            >
              Accept
            </button>
          </li>
        ))}
      </ul>
      <p class="muted">Accepted teams appear in the team menu after the next login.</p>
    </div>
  );
}

// The team's recording setting: whether members' typing is kept in their terminal
// recordings (admins' and owners' always is unless a session says otherwise).
function Recording() {
  const settings = useLoad(async () => ok(await api.GET("/v1/team/settings")), []);
  const [on, setOn] = useState<boolean | null>(null);
  const { error, run } = useAction();
  if (!settings.data) return null;
  const checked = on ?? settings.data.record_members_input;
  const toggle = (event: Event) => {
    const wanted = (event.target as HTMLInputElement).checked;
    setOn(wanted);
    return run(async () => {
      try {
        const saved = ok(await api.PATCH("/v1/team/settings", { body: { record_members_input: wanted } }));
        setOn(saved.record_members_input);
      } catch (failure) {
        setOn(!wanted);
        throw failure;
      }
    });
  };
  return (
    <div class="panel">
      <h2>Terminal recordings</h2>
      <label>
        <input type="checkbox" checked={checked} onChange={toggle} /> Record what members type in their terminal sessions
      </label>
      <p class="muted">Off by default: a member's typing may be a password. Admins' and owners' typing is recorded.</p>
      <ErrorNote error={error} />
    </div>
  );
}

export function Members() {
  const members = useLoad(async () => ok(await api.GET("/v1/team/members")), []);
  const invitations = useLoad(async () => (isAdmin() ? ok(await api.GET("/v1/team/invitations")) : { items: [] }), []);
  const { error, run } = useAction();
  const admin = isAdmin();
  const act = (call: () => Promise<unknown>) =>
    run(async () => {
      await call();
      members.reload();
    });
  return (
    <Page title="Members">
      <MyInvitations />
      {admin ? <Invite onDone={invitations.reload} /> : <p class="muted">Only owners and admins invite, change roles and remove members.</p>}
      <ErrorNote error={members.error || explain(error)} />
      {!members.data ? (
        <Loading what="members" />
      ) : (
        <table>
          <thead>
            <tr>
              <th>E-mail</th>
              <th>Role</th>
              <th>Joined</th>
              {admin ? <ActionsHead /> : null}
            </tr>
          </thead>
          <tbody>
            {members.data.items.map((member) => (
              <tr>
                <td>{member.email}</td>
                <td>
                  {admin ? (
                    <select
                      aria-label={`Role of ${member.email}`}
                      value={member.role}
                      onChange={(event) =>
                        act(async () =>
                          ok(
                            await api.PATCH("/v1/team/members/{user_id}", {
                              params: { path: { user_id: member.user_id } },
                              body: { role: (event.target as HTMLSelectElement).value as S<"Role"> },
                            }),
                          ),
                        )
                      }
                    >
                      <option value="member">member</option>
                      <option value="admin">admin</option>
                      <option value="owner">owner</option>
                    </select>
                  ) : (
                    member.role
                  )}
                </td>
                <td>{when(member.joined_at)}</td>
                {admin ? (
                  <td>
                    <button
                      type="button"
                      class="danger"
                      aria-label={`Remove ${member.email}`}
                      onClick={() =>
                        confirm(`Remove ${member.email} from the team?`) &&
                        act(async () => ok(await api.DELETE("/v1/team/members/{user_id}", { params: { path: { user_id: member.user_id } } })))
                      }
                    >
                      Remove
                    </button>
                  </td>
                ) : null}
              </tr>
            ))}
          </tbody>
        </table>
      )}
      {admin && invitations.data?.items.length ? (
        <div class="panel">
          <h2>Pending invitations</h2>
          <ul>
            {invitations.data.items.map((invitation) => (
              <li>
                {invitation.email} as {invitation.role}, until {when(invitation.expires_at)}
              </li>
            ))}
          </ul>
        </div>
      ) : null}
      {admin ? <Recording /> : null}
    </Page>
  );
}
