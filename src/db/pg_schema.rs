// @generated automatically by Diesel CLI.

diesel::table! {
    deliveries (id) {
        id -> Int8,
        event_row -> Int8,
        state -> Text,
        attempts -> Int4,
        next_attempt_at -> Timestamptz,
        last_status -> Nullable<Int2>,
        last_error -> Nullable<Text>,
        created_at -> Timestamptz,
        delivered_at -> Nullable<Timestamptz>,
        target -> Text,
        source -> Text,
        received_at -> Timestamptz,
        queued_at -> Timestamptz,
        series -> Int4,
        leased_until -> Nullable<Timestamptz>,
        leased_by -> Nullable<Int8>,
    }
}

diesel::table! {
    instances (id) {
        id -> Int8,
        host -> Text,
        pid -> Int8,
        started_at -> Timestamptz,
        locks_taken -> Int8,
    }
}

diesel::table! {
    events (id) {
        id -> Int8,
        source -> Text,
        event_id -> Text,
        event_type -> Nullable<Text>,
        fingerprint -> Bytea,
        received_at -> Timestamptz,
        payload -> Bytea,
        headers -> Jsonb,
        response_status -> Nullable<Int2>,
        response_content_type -> Nullable<Text>,
        response_body -> Nullable<Bytea>,
        replays -> Int8,
        dedupe_key -> Nullable<Bytea>,
    }
}

diesel::table! {
    paces (source, target) {
        source -> Text,
        target -> Text,
        next_start -> Int8,
        interval_us -> Int8,
    }
}

diesel::table! {
    transmissions (transmission_id) {
        transmission_id -> Text,
        source -> Text,
        event_id -> Text,
        body_sha256 -> Bytea,
        seen_at -> Timestamptz,
    }
}

diesel::joinable!(deliveries -> events (event_row));

diesel::allow_tables_to_appear_in_same_query!(deliveries, events, instances, paces, transmissions,);
