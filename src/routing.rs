//! Where a forwarded event lands on an event bus: a NATS subject, an AMQP exchange and routing
//! key, each written in the config as a template over the event's `{source}`, `{event_id}`
//! and `{event_type}`.
//!
//! A template is checked once, when the config is read (an unknown placeholder, a stray brace,
//! or a literal part the bus refuses is a config error). When an event is rendered, the
//! characters of its values that the bus forbids are replaced, so every rendering is a name the
//! bus accepts and the event is never held back by the shape of its id or type:
//! - a NATS subject: in a value, whitespace, control characters, `.` (it would add tokens),
//!   `*` and `>` (wildcards) become `_`, and an empty value (an event without a type) becomes
//!   `_` (a token may not be empty);
//! - an AMQP routing key: values are kept as they are (a `.` separates words for a topic
//!   exchange, as RabbitMQ users expect), control characters become `_`, and the key is cut at
//!   255 bytes (AMQP's limit), on a character boundary;
//! - an AMQP exchange name: in a value, anything but `A-Z a-z 0-9 - _ . :` (AMQP's characters
//!   for an exchange name) becomes `_`, and the name is cut at 255 bytes.
//!
//! Also which event types a target's `events` patterns take ([`pattern_matches`], and
//! [`patterns_overlap`] for two targets'), and which subjects a stream takes
//! ([`subjects_overlap`], [`subjects_cover`]), for the startup check of NATS targets.
//!
//! Low in the tree: `config` parses templates and patterns, and `forward` renders them.

use std::fmt;

/// What a template names, and so which rules its renderings follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A NATS subject (tokens separated by `.`).
    NatsSubject,
    /// An AMQP exchange name.
    AmqpExchange,
    /// An AMQP routing key.
    AmqpRoutingKey,
}

/// AMQP's short strings (exchange names, routing keys, `message_id`) hold at most this many
/// bytes.
pub const AMQP_SHORT_STRING: usize = 255;

/// A placeholder of a template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Source,
    EventId,
    EventType,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Value(Field),
}

/// A parsed template, ready to render for any event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    kind: Kind,
    written: String,
    pieces: Vec<Piece>,
}

/// The event a template is rendered for.
#[derive(Debug, Clone, Copy)]
pub struct Names<'a> {
    /// The source's name.
    pub source: &'a str,
    /// The provider's event id.
    pub event_id: &'a str,
    /// The event type, if the provider gave one.
    pub event_type: Option<&'a str>,
}

impl Template {
    /// Parses `text` as a template of `kind`; the error says what is wrong and how to write it.
    pub fn parse(text: &str, kind: Kind) -> Result<Template, String> {
        let mut pieces = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            let brace = rest.find(['{', '}']).unwrap_or(rest.len());
            if brace > 0 {
                pieces.push(Piece::Text(rest[..brace].to_owned()));
                rest = &rest[brace..];
                continue;
            }
            let Some(end) = rest.find('}').filter(|_| rest.starts_with('{')) else {
                return Err(format!(
                    "{text:?} has a '{}' that opens or closes no placeholder; the placeholders \
                     are {{source}}, {{event_id}} and {{event_type}}",
                    &rest[..1]
                ));
            };
            let field = match &rest[1..end] {
                "source" => Field::Source,
                "event_id" => Field::EventId,
                "event_type" => Field::EventType,
                other => {
                    return Err(format!(
                        "{text:?} has an unknown placeholder {{{other}}}; the placeholders are \
                         {{source}}, {{event_id}} and {{event_type}}"
                    ))
                }
            };
            pieces.push(Piece::Value(field));
            rest = &rest[end + 1..];
        }
        let template = Template {
            kind,
            written: text.to_owned(),
            pieces,
        };
        template.check_literal()?;
        Ok(template)
    }

    /// The literal parts must already be what the bus accepts: values are made to fit when
    /// rendered, the text the operator wrote is not rewritten.
    fn check_literal(&self) -> Result<(), String> {
        let text = &self.written;
        match self.kind {
            Kind::NatsSubject => {
                // Each value renders to at least one character and no '.', so the template's
                // tokens are those of the text with every value as one character.
                let shape: String = self
                    .pieces
                    .iter()
                    .map(|p| match p {
                        Piece::Text(t) => t.as_str(),
                        Piece::Value(_) => "_",
                    })
                    .collect();
                if let Some(c) = shape
                    .chars()
                    .find(|&c| c.is_whitespace() || c.is_control() || c == '*' || c == '>')
                {
                    return Err(format!(
                        "{text:?} holds {c:?}, which a subject hookbox publishes to may not \
                         hold (no whitespace, and no wildcards * or >)"
                    ));
                }
                if shape.split('.').any(str::is_empty) {
                    return Err(format!(
                        "{text:?} has an empty token: a NATS subject is tokens joined by single \
                         dots, with none at either end (e.g. \"webhooks.{{source}}.{{event_type}}\")"
                    ));
                }
            }
            Kind::AmqpExchange | Kind::AmqpRoutingKey => {
                let literal: usize = self
                    .pieces
                    .iter()
                    .map(|p| match p {
                        Piece::Text(t) => t.len(),
                        Piece::Value(_) => 0,
                    })
                    .sum();
                if literal > AMQP_SHORT_STRING {
                    return Err(format!(
                        "{text:?} is {literal} bytes without its placeholders; AMQP allows at \
                         most {AMQP_SHORT_STRING}"
                    ));
                }
                if text.chars().any(char::is_control) {
                    return Err(format!("{text:?} holds a control character"));
                }
            }
        }
        Ok(())
    }

    /// The name for this event, with the characters the bus forbids replaced (see the module
    /// documentation).
    pub fn render(&self, names: Names<'_>) -> String {
        let mut out = String::new();
        for piece in &self.pieces {
            match piece {
                Piece::Text(text) => out.push_str(text),
                Piece::Value(field) => {
                    let value = match field {
                        Field::Source => names.source,
                        Field::EventId => names.event_id,
                        Field::EventType => names.event_type.unwrap_or(""),
                    };
                    self.push_value(&mut out, value);
                }
            }
        }
        match self.kind {
            Kind::NatsSubject => out,
            Kind::AmqpExchange | Kind::AmqpRoutingKey => {
                cut_at(&mut out, AMQP_SHORT_STRING);
                out
            }
        }
    }

    fn push_value(&self, out: &mut String, value: &str) {
        match self.kind {
            Kind::NatsSubject => {
                if value.is_empty() {
                    out.push('_');
                }
                out.extend(value.chars().map(|c| {
                    if c.is_whitespace() || c.is_control() || matches!(c, '.' | '*' | '>') {
                        '_'
                    } else {
                        c
                    }
                }));
            }
            Kind::AmqpRoutingKey => {
                out.extend(value.chars().map(|c| if c.is_control() { '_' } else { c }));
            }
            Kind::AmqpExchange => {
                out.extend(value.chars().map(|c| {
                    if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':') {
                        c
                    } else {
                        '_'
                    }
                }));
            }
        }
    }
}

impl Template {
    /// Every subject a NATS subject template renders to for `source`'s events, as its tokens
    /// with `*` for the event's id or type: `webhooks.stripe.*`, `hooks.t-*` (a literal holds
    /// no `*`, checked when parsed). A token with `*` and more is not a NATS pattern; see
    /// [`nats_pattern`] for one.
    pub fn subjects_of(&self, source: &str) -> String {
        let mut shape = String::new();
        for piece in &self.pieces {
            match piece {
                Piece::Text(text) => shape.push_str(text),
                Piece::Value(Field::Source) => self.push_value(&mut shape, source),
                Piece::Value(Field::EventId | Field::EventType) => shape.push('*'),
            }
        }
        shape
    }

    /// What this template renders to for every event of `source`, where that is one name:
    /// no placeholder but `{source}`.
    pub fn fixed(&self, source: &str) -> Option<String> {
        self.pieces
            .iter()
            .all(|p| matches!(p, Piece::Text(_) | Piece::Value(Field::Source)))
            .then(|| {
                self.render(Names {
                    source,
                    event_id: "",
                    event_type: None,
                })
            })
    }
}

/// Whether `text` matches `pattern`, where `*` stands for any run of characters (none
/// included) and every other character for itself.
pub fn pattern_matches(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// Whether some text matches both `a` and `b`, patterns as for [`pattern_matches`]: whether
/// two targets' `events` patterns can take the same event type.
pub fn patterns_overlap(a: &str, b: &str) -> bool {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    // reach[i][j]: some text takes `a` to its i-th character and `b` to its j-th at once.
    let mut reach = vec![vec![false; b.len() + 1]; a.len() + 1];
    reach[0][0] = true;
    for i in 0..=a.len() {
        for j in 0..=b.len() {
            if !reach[i][j] {
                continue;
            }
            let (x, y) = (a.get(i).copied(), b.get(j).copied());
            // A star may stand for nothing.
            if x == Some('*') {
                reach[i + 1][j] = true;
            }
            if y == Some('*') {
                reach[i][j + 1] = true;
            }
            // One more character of the text: a literal moves on, a star takes it and stays.
            match (x, y) {
                (Some('*'), Some(c)) if c != '*' => reach[i][j + 1] = true,
                (Some(c), Some('*')) if c != '*' => reach[i + 1][j] = true,
                (Some(c), Some(d)) if c == d && c != '*' => reach[i + 1][j + 1] = true,
                _ => {}
            }
        }
    }
    reach[a.len()][b.len()]
}

/// [`Template::subjects_of`]'s subjects as a NATS pattern: a token holding `*` is `*`.
pub fn nats_pattern(subjects: &str) -> String {
    subjects
        .split('.')
        .map(|token| if token.contains('*') { "*" } else { token })
        .collect::<Vec<_>>()
        .join(".")
}

/// Whether a stream whose subject pattern is `stream` (NATS: `*` any one token, a last `>` one
/// or more) captures some of `subjects` ([`Template::subjects_of`]'s).
pub fn subjects_overlap(stream: &str, subjects: &str) -> bool {
    let (mut stream, mut ours) = (stream.split('.'), subjects.split('.'));
    loop {
        match (stream.next(), ours.next()) {
            (None, None) | (Some(">"), Some(_)) => return true,
            // A stream's token with a `*` among other characters is that text, which no
            // rendering holds (a value's `*` becomes `_`, and a literal has none).
            (Some(s), Some(o))
                if s == "*"
                    || (!s.contains('*')
                        && (s == o || (o.contains('*') && pattern_matches(o, s)))) => {}
            _ => return false,
        }
    }
}

/// Whether a stream whose subject pattern is `stream` captures all of `subjects`.
pub fn subjects_cover(stream: &str, subjects: &str) -> bool {
    let (mut stream, mut ours) = (stream.split('.'), subjects.split('.'));
    loop {
        match (stream.next(), ours.next()) {
            (None, None) | (Some(">"), Some(_)) => return true,
            (Some(s), Some(o)) if s == "*" || (s == o && !o.contains('*')) => {}
            _ => return false,
        }
    }
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.written)
    }
}

/// Shortens `text` to at most `max` bytes, on a character boundary.
pub fn cut_at(text: &mut String, max: usize) {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names<'a>(event_id: &'a str, event_type: Option<&'a str>) -> Names<'a> {
        Names {
            source: "stripe",
            event_id,
            event_type,
        }
    }

    #[test]
    fn a_subject_templates_subjects_are_a_pattern_with_the_events_tokens_as_wildcards() {
        let parse = |text| Template::parse(text, Kind::NatsSubject).expect("valid");
        assert_eq!(
            parse("webhooks.{source}.{event_type}").subjects_of("stripe"),
            "webhooks.stripe.*"
        );
        assert_eq!(
            parse("hooks.t-{event_type}.{event_id}.x").subjects_of("a b"),
            "hooks.t-*.*.x"
        );
        assert_eq!(nats_pattern("hooks.t-*.*.x"), "hooks.*.*.x");
        assert_eq!(parse("in.{source}-all").subjects_of("gh"), "in.gh-all");
        assert!(subjects_overlap("webhooks.>", "webhooks.stripe.*"));
        assert!(subjects_overlap("webhooks.*.*", "webhooks.stripe.*"));
        assert!(subjects_overlap(
            "webhooks.stripe.paid",
            "webhooks.stripe.*"
        ));
        assert!(subjects_overlap(">", "a"));
        assert!(!subjects_overlap("webhooks.github.*", "webhooks.stripe.*"));
        assert!(!subjects_overlap("webhooks.*", "webhooks.stripe.*"));
        assert!(!subjects_overlap(
            "webhooks.stripe.*.>",
            "webhooks.stripe.*"
        ));
        assert!(!subjects_overlap("webhooks.>", "webhooks"));
        assert!(subjects_overlap("hooks.t-paid", "hooks.t-*"));
        assert!(!subjects_overlap("hooks.u-only", "hooks.t-*"));
        assert!(
            !subjects_overlap("hooks.t-*", "hooks.t-*"),
            "a literal t-* in a stream"
        );
        assert!(subjects_cover("hooks.*", "hooks.t-*"));
        assert!(!subjects_cover("hooks.t-paid", "hooks.t-*"));
        assert!(subjects_cover("webhooks.>", "webhooks.stripe.*"));
        assert!(subjects_cover("webhooks.*.*", "webhooks.stripe.*"));
        assert!(subjects_cover("webhooks.stripe.*", "webhooks.stripe.*"));
        assert!(subjects_cover(">", "a.*"));
        assert!(!subjects_cover("webhooks.stripe.paid", "webhooks.stripe.*"));
        assert!(!subjects_cover("webhooks.*", "webhooks.stripe.*"));
        assert!(!subjects_cover("webhooks.stripe.*.*", "webhooks.stripe.*"));
    }

    #[test]
    fn an_exchange_is_fixed_only_without_the_events_own_placeholders() {
        let parse = |text| Template::parse(text, Kind::AmqpExchange).expect("valid");
        assert_eq!(
            parse("webhooks").fixed("stripe").as_deref(),
            Some("webhooks")
        );
        assert_eq!(
            parse("in.{source}").fixed("stripe").as_deref(),
            Some("in.stripe")
        );
        assert_eq!(parse("").fixed("stripe").as_deref(), Some(""));
        assert_eq!(parse("{event_type}").fixed("stripe"), None);
    }

    #[test]
    fn star_matches_any_run_of_characters() {
        for (pattern, text, matches) in [
            ("*", "", true),
            ("*", "a.b", true),
            ("a.*", "a.b", true),
            ("a.*", "a.", true),
            ("a.*", "a", false),
            ("*.created", "customer.created", true),
            ("*.created", "customer.created.x", false),
            ("a*b*c", "abc", true),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxcyyb", false),
            ("ab*ba", "aba", false),
            ("exact", "exact", true),
            ("exact", "exactly", false),
            ("a.b", "aXb", false),
        ] {
            assert_eq!(
                pattern_matches(pattern, text),
                matches,
                "{pattern} ~ {text}"
            );
        }
    }

    #[test]
    fn two_patterns_overlap_when_some_type_matches_both() {
        for (a, b, overlap) in [
            ("x.*", "y.*", false),
            ("x.*", "x.paid", true),
            ("*", "anything", true),
            ("pay*", "*ed", true),
            ("*.created", "customer.*", true),
            ("a*b", "a*c", false),
            ("exact", "exact", true),
            ("exact", "exactly", false),
            ("*.paid", "*.refunded", false),
        ] {
            assert_eq!(patterns_overlap(a, b), overlap, "{a} ~ {b}");
            assert_eq!(patterns_overlap(b, a), overlap, "{b} ~ {a}");
        }
    }

    #[test]
    fn a_subject_keeps_its_tokens_whatever_the_values_hold() {
        let subject =
            Template::parse("webhooks.{source}.{event_type}", Kind::NatsSubject).expect("valid");
        assert_eq!(
            subject.render(names("evt_1", Some("payment_intent.succeeded"))),
            "webhooks.stripe.payment_intent_succeeded"
        );
        assert_eq!(
            subject.render(names("evt_1", Some("a b*c>d\te"))),
            "webhooks.stripe.a_b_c_d_e"
        );
        assert_eq!(
            subject.render(names("evt_1", None)),
            "webhooks.stripe._",
            "an empty value is one token"
        );
        assert_eq!(
            subject.render(names("evt_1", Some("ünïcode"))),
            "webhooks.stripe.ünïcode"
        );
    }

    #[test]
    fn a_routing_key_keeps_dots_and_fits_in_255_bytes() {
        let key = Template::parse("{source}.{event_type}.{event_id}", Kind::AmqpRoutingKey)
            .expect("valid");
        assert_eq!(
            key.render(names("evt_1", Some("charge.refunded"))),
            "stripe.charge.refunded.evt_1"
        );
        let long = "é".repeat(200);
        let rendered = key.render(names(&long, Some("t")));
        assert!(rendered.len() <= AMQP_SHORT_STRING, "{}", rendered.len());
        assert!(rendered.len() >= AMQP_SHORT_STRING - 1);
        assert!(rendered.starts_with("stripe.t.éé"));
    }

    #[test]
    fn an_exchange_name_keeps_to_amqp_characters() {
        let exchange = Template::parse("hooks-{event_type}", Kind::AmqpExchange).expect("valid");
        assert_eq!(
            exchange.render(names("e", Some("order/created now"))),
            "hooks-order_created_now"
        );
        assert_eq!(
            Template::parse("", Kind::AmqpExchange)
                .expect("the default exchange")
                .render(names("e", None)),
            ""
        );
    }

    #[test]
    fn bad_templates_say_what_is_wrong() {
        let cases = [
            (
                "webhooks.{sorce}",
                Kind::NatsSubject,
                "unknown placeholder {sorce}",
            ),
            (
                "webhooks.{source",
                Kind::NatsSubject,
                "opens or closes no placeholder",
            ),
            (
                "webhooks.source}",
                Kind::NatsSubject,
                "opens or closes no placeholder",
            ),
            ("webhooks..{source}", Kind::NatsSubject, "empty token"),
            ("webhooks.{source}.", Kind::NatsSubject, "empty token"),
            ("", Kind::NatsSubject, "empty token"),
            ("webhooks.>", Kind::NatsSubject, "wildcards"),
            ("web hooks", Kind::NatsSubject, "whitespace"),
            (
                "{event}",
                Kind::AmqpRoutingKey,
                "unknown placeholder {event}",
            ),
        ];
        for (text, kind, problem) in cases {
            let error = Template::parse(text, kind).expect_err(text);
            assert!(error.contains(problem), "{text}: {error}");
        }
        let long = "x".repeat(256);
        assert!(Template::parse(&long, Kind::AmqpRoutingKey)
            .expect_err("too long")
            .contains("at most 255"));
        assert!(Template::parse(
            &format!("{}{{event_id}}", "x".repeat(255)),
            Kind::AmqpRoutingKey
        )
        .is_ok());
    }
}
