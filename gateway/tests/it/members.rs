use serde_json::json;

use crate::helpers::{email, spawn_app};

#[allow(
    clippy::too_many_lines,
    reason = "one end-to-end scenario whose steps build on each other"
)]
#[tokio::test]
async fn roles_govern_what_members_may_do() {
    let app = spawn_app().await;
    let owner_email = email("owner");
    let owner = app.signup(&owner_email, "Team").await;
    let owner_key = owner.api_key.token.as_str();
    let bob_email = email("bob");
    let bob = app.signup(&bob_email, "Bob's own").await;

    // Adding is inviting, and says nothing of whether an address has an account; the
    // invitee joins by accepting, once.
    let ghost = app
        .post(
            "/v1/team/members",
            owner_key,
            json!({ "email": "ghost@example.com" }),
        )
        .await;
    assert_eq!(ghost.status, 201, "{}", ghost.body);
    app.add_member(owner_key, &bob_email, "member").await;
    app.post(
        "/v1/team/members",
        owner_key,
        json!({ "email": bob_email.to_uppercase() }),
    )
    .await
    .assert_error(409, "already_member");

    // Bob, as a member of the owner's team.
    let bob_session = app.login(&bob_email, Some(owner.team.id)).await;
    let members = app.get("/v1/team/members", &bob_session).await;
    assert_eq!(members.body["items"].as_array().unwrap().len(), 2);
    app.post(
        "/v1/team/members",
        &bob_session,
        json!({ "email": owner_email }),
    )
    .await
    .assert_error(403, "forbidden");
    app.patch(
        &format!("/v1/team/members/{}", bob.user.id),
        &bob_session,
        json!({ "role": "owner" }),
    )
    .await
    .assert_error(403, "forbidden");
    app.get("/v1/audit", &bob_session)
        .await
        .assert_error(403, "forbidden");
    let (bob_key_id, bob_key) = app.create_key(&bob_session, json!({ "name": "bob" })).await;
    assert_eq!(app.get("/v1/me", &bob_key).await.body["role"], "member");
    // A member revokes their own keys, not others'.
    app.delete(
        &format!("/v1/api-keys/{}", owner.api_key.key.id),
        &bob_session,
    )
    .await
    .assert_error(403, "forbidden");
    let (_, spare) = app
        .create_key(&bob_session, json!({ "name": "spare" }))
        .await;
    let spare_id = app.get("/v1/me", &spare).await.body["api_key"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // Not with another of his keys (lineage, not the creating user, decides), but as the
    // person who made it.
    app.delete(&format!("/v1/api-keys/{spare_id}"), &bob_key)
        .await
        .assert_error(403, "forbidden");
    assert_eq!(
        app.delete(&format!("/v1/api-keys/{spare_id}"), &bob_session)
            .await
            .status,
        204
    );

    // Promoted to admin, Bob manages members but not owners.
    let promoted = app
        .patch(
            &format!("/v1/team/members/{}", bob.user.id),
            owner_key,
            json!({ "role": "admin" }),
        )
        .await;
    assert_eq!(promoted.status, 200, "{}", promoted.body);
    assert_eq!(promoted.body["role"], "admin");
    let (_, bob_admin_key) = app
        .create_key(
            &bob_session,
            json!({ "name": "admin key", "role": "admin" }),
        )
        .await;
    assert_eq!(
        app.get("/v1/me", &bob_admin_key).await.body["role"],
        "admin"
    );
    app.delete(&format!("/v1/team/members/{}", owner.user.id), &bob_session)
        .await
        .assert_error(403, "forbidden");
    app.patch(
        &format!("/v1/team/members/{}", owner.user.id),
        &bob_session,
        json!({ "role": "member" }),
    )
    .await
    .assert_error(403, "forbidden");

    // Demoted again: his admin key is capped to member at once.
    app.patch(
        &format!("/v1/team/members/{}", bob.user.id),
        owner_key,
        json!({ "role": "member" }),
    )
    .await;
    assert_eq!(
        app.get("/v1/me", &bob_admin_key).await.body["role"],
        "member"
    );

    // Removed: his session and his keys for this team stop working; his own team is untouched.
    let removed = app
        .delete(&format!("/v1/team/members/{}", bob.user.id), owner_key)
        .await;
    assert_eq!(removed.status, 204, "{}", removed.body);
    app.get("/v1/me", &bob_session)
        .await
        .assert_error(401, "invalid_session");
    app.get("/v1/me", &bob_key)
        .await
        .assert_error(401, "api_key_revoked");
    assert_eq!(app.get("/v1/me", &bob.api_key.token).await.status, 200);
    let revoked = app
        .count(&format!(
            "SELECT count(*) FROM api_keys WHERE id = '{bob_key_id}' AND revoked_at IS NOT NULL"
        ))
        .await;
    assert_eq!(revoked, 1);
}

#[tokio::test]
async fn the_last_owner_can_be_neither_removed_nor_demoted() {
    let app = spawn_app().await;
    let owner = app.signup(&email("only"), "Solo").await;
    let key = owner.api_key.token.as_str();
    let me = format!("/v1/team/members/{}", owner.user.id);
    app.delete(&me, key).await.assert_error(409, "last_owner");
    app.patch(&me, key, json!({ "role": "admin" }))
        .await
        .assert_error(409, "last_owner");
    assert_eq!(
        app.count("SELECT count(*) FROM team_members WHERE role = 'owner'")
            .await,
        1
    );

    // With a second owner, the first may leave.
    let heir_email = email("heir");
    let heir = app.signup(&heir_email, "Heir's").await;
    app.add_member(key, &heir_email, "owner").await;
    assert_eq!(app.delete(&me, key).await.status, 204);
    // The leaver's key for the team was revoked with the membership.
    app.get("/v1/me", key)
        .await
        .assert_error(401, "api_key_revoked");
    let heir_session = app.login(&heir_email, Some(owner.team.id)).await;
    let heir_path = format!("/v1/team/members/{}", heir.user.id);
    app.delete(&heir_path, &heir_session)
        .await
        .assert_error(409, "last_owner");
}

#[tokio::test]
async fn concurrent_owner_removals_keep_one_owner() {
    let app = spawn_app().await;
    let first = app.signup(&email("a"), "Pair").await;
    let second_email = email("b");
    let second = app.signup(&second_email, "B").await;
    app.add_member(&first.api_key.token, &second_email, "owner")
        .await;
    let second_session = app.login(&second_email, Some(first.team.id)).await;
    // Each owner removes the other at the same moment: one must fail.
    let remove_second = format!("/v1/team/members/{}", second.user.id);
    let remove_first = format!("/v1/team/members/{}", first.user.id);
    let (a, b) = tokio::join!(
        app.delete(&remove_second, &first.api_key.token),
        app.delete(&remove_first, &second_session),
    );
    let statuses = [a.status.as_u16(), b.status.as_u16()];
    assert!(statuses.contains(&204), "{statuses:?}");
    assert!(
        statuses.contains(&409) || statuses.contains(&401),
        "both removals succeeded: {statuses:?}"
    );
    let owners: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM team_members WHERE team_id = $1 AND role = 'owner'",
    )
    .bind(first.team.id)
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(owners, 1);
}

#[tokio::test]
async fn nobody_is_put_in_a_team_without_accepting() {
    let app = spawn_app().await;
    let attacker = app.signup(&email("attacker"), "Attacker").await;
    let attacker_key = attacker.api_key.token.as_str();
    let victim_email = email("victim");
    let victim = app.signup(&victim_email, "Victim").await;
    // Inviting a registered and an unregistered address answer alike: no enumeration.
    let registered = app
        .post(
            "/v1/team/members",
            attacker_key,
            json!({ "email": victim_email }),
        )
        .await;
    let unregistered = app
        .post(
            "/v1/team/members",
            attacker_key,
            json!({ "email": email("nobody") }),
        )
        .await;
    assert_eq!(registered.status, 201, "{}", registered.body);
    assert_eq!(unregistered.status, registered.status);
    let keys = |body: &serde_json::Value| {
        let mut keys: Vec<String> = body.as_object().unwrap().keys().cloned().collect();
        keys.sort();
        keys
    };
    assert_eq!(keys(&registered.body), keys(&unregistered.body));
    // The victim is in no team of the attacker's until they accept.
    let members = app.get("/v1/team/members", attacker_key).await;
    assert_eq!(members.body["items"].as_array().unwrap().len(), 1);
    app.post(
        "/v1/auth/login",
        "",
        json!({ "email": victim_email, "password": crate::helpers::PASSWORD, "team_id": attacker.team.id }),
    )
    .await
    .assert_error(404, "not_found");
    let id = registered.body["id"].as_str().unwrap().to_owned();
    let accept = format!("/v1/invitations/{id}/accept");
    // Nobody else accepts it for them, and an API key (even theirs) cannot.
    let other_email = email("other");
    app.signup(&other_email, "Other").await;
    let other_session = app.login(&other_email, None).await;
    app.post(&accept, &other_session, json!({}))
        .await
        .assert_error(404, "not_found");
    app.post(&accept, &victim.api_key.token, json!({}))
        .await
        .assert_error(403, "forbidden");
    // The victim sees it, and accepting is their own decision.
    let victim_session = app.login(&victim_email, None).await;
    let mine = app.get("/v1/invitations", &victim_session).await;
    assert_eq!(mine.body["items"][0]["team"]["id"], json!(attacker.team.id));
    let pending = app.get("/v1/team/invitations", attacker_key).await;
    assert_eq!(pending.body["items"].as_array().unwrap().len(), 2);
    let joined = app.post(&accept, &victim_session, json!({})).await;
    assert_eq!(joined.status, 201, "{}", joined.body);
    app.post(&accept, &victim_session, json!({}))
        .await
        .assert_error(404, "not_found");
    let members = app.get("/v1/team/members", attacker_key).await;
    assert_eq!(members.body["items"].as_array().unwrap().len(), 2);
}

/// A capped, expiring key (made by the owner, say for an agent) must not escape its cap by
/// inviting an outside account that then mints uncapped keys or removes the owner.
#[tokio::test]
async fn a_restricted_key_never_changes_membership() {
    let app = spawn_app().await;
    let owner_email = email("owner");
    let owner = app.signup(&owner_email, "Team").await;
    let owner_key = owner.api_key.token.as_str();
    let session = app.login(&owner_email, None).await;
    let outsider_email = email("outsider");
    app.signup(&outsider_email, "Outside").await;

    // A key made without a role is a member's key, whoever makes it.
    let (_, plain) = app.create_key(&session, json!({ "name": "plain" })).await;
    assert_eq!(app.get("/v1/me", &plain).await.body["role"], "member");
    app.post(
        "/v1/team/members",
        &plain,
        json!({ "email": outsider_email }),
    )
    .await
    .assert_error(403, "forbidden");

    // Even asked for with the owner's role, a key with a cap, an expiry or a parent is
    // refused every membership change.
    let (_, capped) = app
        .create_key(
            &session,
            json!({ "name": "agent", "role": "owner", "max_credits": "1", "expires_in_secs": 3600 }),
        )
        .await;
    let (_, expiring) = app
        .create_key(
            &session,
            json!({ "name": "ci", "role": "owner", "expires_in_secs": 3600 }),
        )
        .await;
    let (_, uncapped_parent) = app
        .create_key(&session, json!({ "name": "parent", "role": "owner" }))
        .await;
    let (_, child) = app
        .create_key(
            &uncapped_parent,
            json!({ "name": "child", "role": "owner" }),
        )
        .await;
    let owner_path = format!("/v1/team/members/{}", owner.user.id);
    for key in [&capped, &expiring, &child] {
        app.post(
            "/v1/team/members",
            key,
            json!({ "email": outsider_email, "role": "owner" }),
        )
        .await
        .assert_error(403, "restricted_key");
        app.patch(&owner_path, key, json!({ "role": "member" }))
            .await
            .assert_error(403, "restricted_key");
        app.delete(&owner_path, key)
            .await
            .assert_error(403, "restricted_key");
    }
    // Nothing was changed: no invitation, the owner still the owner.
    let pending = app.get("/v1/team/invitations", owner_key).await;
    assert_eq!(pending.body["items"].as_array().unwrap().len(), 0);
    assert_eq!(app.get(&owner_path, owner_key).await.body["role"], "owner");
    // An unrestricted owner's key (the CLI's) still manages the team.
    let invited = app
        .post(
            "/v1/team/members",
            &uncapped_parent,
            json!({ "email": outsider_email }),
        )
        .await;
    assert_eq!(invited.status, 201, "{}", invited.body);
}
