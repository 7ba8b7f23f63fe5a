//! Honest 503s: `/readyz` checks that the store takes a write, and an answer says what went
//! wrong (a permission, not "unreachable") without quoting the database.

use diesel::prelude::*;
use hookbox::Handlers;

use crate::helpers::*;

/// A login role of the test's own, dropped (with what it owns) when it goes.
struct Role(String);

impl Role {
    fn create(name: &str) -> Role {
        let mut server = PgConnection::establish(&server_url()).expect("connect to the server");
        diesel::sql_query(format!("CREATE ROLE {name} LOGIN"))
            .execute(&mut server)
            .expect("create the role");
        Role(name.to_owned())
    }
}

impl Drop for Role {
    fn drop(&mut self) {
        if let Ok(mut server) = PgConnection::establish(&server_url()) {
            let _ =
                diesel::sql_query(format!("DROP ROLE IF EXISTS {}", self.0)).execute(&mut server);
        }
    }
}

/// `statement`, run by the superuser in the test's database.
fn as_superuser(db: &TestDb, statement: &str) {
    let mut conn =
        PgConnection::establish(&with_database(&server_url(), &db.name)).expect("connect");
    diesel::sql_query(statement)
        .execute(&mut conn)
        .unwrap_or_else(|e| panic!("{statement}: {e}"));
}

#[actix_web::test]
async fn after_revoke_insert_readyz_is_not_ready_and_a_delivery_says_permission() {
    if skip_on_sqlite(
        "after_revoke_insert_readyz_is_not_ready_and_a_delivery_says_permission",
        "SQLite has no roles to revoke a privilege from",
    ) {
        return;
    }
    let server = server_url();
    if !server.contains("://postgres@") {
        eprintln!(
            "skipped: DATABASE_URL does not name the postgres user, so no role can be swapped in"
        );
        return;
    }
    let db = TestDb::create();
    // Dropped after the app's database, which is dropped with the app, declared later.
    let role = Role::create(&format!("{}_role", db.name));
    as_superuser(
        &db,
        &format!("ALTER DATABASE {} OWNER TO {}", db.name, role.0),
    );
    as_superuser(&db, &format!("ALTER SCHEMA public OWNER TO {}", role.0));
    let url = with_database(&server, &db.name).replace("://postgres@", &format!("://{}@", role.0));
    let config = parse_config(&config_text(&url, ""));
    let app = TestApp::spawn_on(db, config, Handlers::default()).await;

    let ready = app.get("/readyz", None).await;
    assert_eq!(ready.status, 200, "{}", ready.text());

    as_superuser(&app.db, &format!("REVOKE INSERT ON events FROM {}", role.0));
    let ready = app.get("/readyz", None).await;
    assert_eq!(ready.status, 503, "{}", ready.text());
    assert_eq!(ready.error(), "unavailable");
    let message = ready.json()["message"].as_str().unwrap_or("").to_owned();
    assert!(message.contains("permission"), "{message}");
    assert!(!message.contains("unreachable"), "{message}");

    let id = unique_id("evt_revoked");
    let answer = app
        .send(&app.delivery("stripe", &stripe_event(&id, "charge.succeeded", 1), &id))
        .await;
    assert_eq!(
        (answer.status, answer.error().as_str()),
        (503, "unavailable")
    );
    let message = answer.json()["message"].as_str().unwrap_or("").to_owned();
    assert!(message.contains("permission"), "{message}");
    assert!(
        !message.contains("events"),
        "the database's own words stay out: {message}"
    );

    as_superuser(&app.db, &format!("GRANT INSERT ON events TO {}", role.0));
    let ready = app.get("/readyz", None).await;
    assert_eq!(ready.status, 200, "{}", ready.text());
}
