// @generated automatically by Diesel CLI.

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
    }
}
