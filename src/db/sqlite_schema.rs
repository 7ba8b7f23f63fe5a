//! The embedded store's tables, as `src/db/pg_schema.rs` has them on PostgreSQL: the same
//! names and Rust types, in SQLite's SQL types.

diesel::table! {
    deliveries (id) {
        id -> BigInt,
        event_row -> BigInt,
        state -> Text,
        attempts -> Integer,
        next_attempt_at -> TimestamptzSqlite,
        last_status -> Nullable<SmallInt>,
        last_error -> Nullable<Text>,
        created_at -> TimestamptzSqlite,
        delivered_at -> Nullable<TimestamptzSqlite>,
        target -> Text,
        source -> Text,
        received_at -> TimestamptzSqlite,
        queued_at -> TimestamptzSqlite,
        series -> Integer,
        leased_until -> Nullable<TimestamptzSqlite>,
        leased_by -> Nullable<BigInt>,
    }
}

diesel::table! {
    instances (id) {
        id -> BigInt,
        host -> Text,
        pid -> BigInt,
        started_at -> TimestamptzSqlite,
        locks_taken -> BigInt,
    }
}

diesel::table! {
    events (id) {
        id -> BigInt,
        source -> Text,
        event_id -> Text,
        event_type -> Nullable<Text>,
        fingerprint -> Binary,
        received_at -> TimestamptzSqlite,
        payload -> Binary,
        headers -> Json,
        response_status -> Nullable<SmallInt>,
        response_content_type -> Nullable<Text>,
        response_body -> Nullable<Binary>,
        replays -> BigInt,
        dedupe_key -> Nullable<Binary>,
    }
}

diesel::table! {
    paces (source, target) {
        source -> Text,
        target -> Text,
        next_start -> BigInt,
        interval_us -> BigInt,
    }
}

diesel::table! {
    transmissions (transmission_id) {
        transmission_id -> Text,
        source -> Text,
        event_id -> Text,
        body_sha256 -> Binary,
        seen_at -> TimestamptzSqlite,
    }
}

diesel::joinable!(deliveries -> events (event_row));

diesel::allow_tables_to_appear_in_same_query!(deliveries, events, instances, paces, transmissions,);
