//! The console's HTML: the page layout with its inline CSS, the headers every console answer
//! carries, and how times and bodies are shown. Pages are maud templates, which escape every
//! value they interpolate; only [`STYLE`], a constant, goes in unescaped.

use actix_web::http::{header, StatusCode};
use actix_web::HttpResponse;
use base64::Engine;
use chrono::{DateTime, Utc};
use maud::{html, Markup, PreEscaped, DOCTYPE};

use super::session::Session;

/// Scripts may not run at all, whatever a page contains; styles only inline; no requests to
/// anywhere but this console's own forms.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; style-src 'unsafe-inline'; \
     img-src data:; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

/// `path?k=v&...`, the pairs form-encoded (empty values left out).
pub fn link(path: &str, pairs: &[(&str, &str)]) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    for (name, value) in pairs.iter().filter(|(_, v)| !v.is_empty()) {
        query.append_pair(name, value);
    }
    let query = query.finish();
    if query.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{query}")
    }
}

/// A time as the console shows it, always in UTC.
pub fn time(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%S%.3f UTC").to_string()
}

/// A stored body as the console shows it.
pub struct Shown {
    /// The text to show.
    pub text: String,
    /// What the text is, when it is not the body as it came.
    pub note: Option<&'static str>,
}

/// JSON re-indented (keys, numbers and escapes exactly as sent), other UTF-8 as it is, and
/// anything else as base64.
pub fn show_body(bytes: &[u8]) -> Shown {
    match std::str::from_utf8(bytes) {
        Ok(text) if serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok() => {
            match indent_json(text) {
                Some(indented) => Shown {
                    text: indented,
                    note: Some("JSON, re-indented"),
                },
                None => Shown {
                    text: text.to_owned(),
                    note: Some("JSON, shown as sent: nested too deep to re-indent"),
                },
            }
        }
        Ok(text) => Shown {
            text: text.to_owned(),
            note: None,
        },
        Err(_) => Shown {
            text: base64::engine::general_purpose::STANDARD.encode(bytes),
            note: Some("not UTF-8, shown as base64"),
        },
    }
}

/// Lays valid JSON out two spaces per level without parsing it into values, so nothing about
/// the document changes but its whitespace. `None` when the layout would outgrow twice the
/// body and 64 KiB: indentation grows with the square of the nesting, and a small body nested
/// thousands deep would make a page of gigabytes.
fn indent_json(json: &str) -> Option<String> {
    fn newline(out: &mut String, depth: usize) {
        out.push('\n');
        out.extend(std::iter::repeat_n("  ", depth));
    }
    let budget = 2 * json.len() + 64 * 1024;
    let mut out = String::with_capacity(json.len() * 2);
    let mut depth = 0usize;
    let (mut in_string, mut escaped) = (false, false);
    let mut chars = json.chars().peekable();
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push(c);
            }
            '{' | '[' => {
                while chars.peek().is_some_and(|c| c.is_whitespace()) {
                    chars.next();
                }
                out.push(c);
                let close = if c == '{' { '}' } else { ']' };
                if chars.peek() == Some(&close) {
                    chars.next();
                    out.push(close);
                } else {
                    depth += 1;
                    newline(&mut out, depth);
                }
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                newline(&mut out, depth);
                out.push(c);
            }
            ',' => {
                out.push(c);
                newline(&mut out, depth);
            }
            ':' => out.push_str(": "),
            c if c.is_whitespace() => {}
            c => out.push(c),
        }
        if out.len() > budget {
            return None;
        }
    }
    Some(out)
}

const STYLE: &str = "\
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}\
header{display:flex;gap:1.4em;align-items:center;padding:.6em 1.5em;background:#1d2330;color:#fff}\
header a{color:#cfe0ff;text-decoration:none}header a:hover{text-decoration:underline}\
header .brand{font-weight:600;color:#fff}header form{margin-left:auto}\
main{padding:1em 1.5em 3em;max-width:1200px}h1{font-size:1.4em;margin:.3em 0 .6em}h2{font-size:1.1em;margin:1.2em 0 .4em}\
table{border-collapse:collapse;width:100%;background:#fff}\
th,td{text-align:left;padding:.35em .6em;border-bottom:1px solid #e3e6ea;vertical-align:top;overflow-wrap:anywhere}h1,dd{overflow-wrap:anywhere}\
th{font-weight:600;background:#eef0f3}td.num,th.num{text-align:right}\
pre{background:#fff;border:1px solid #e3e6ea;padding:.8em;overflow:auto;white-space:pre-wrap;overflow-wrap:anywhere;margin:.3em 0}\
code,pre{font:12.5px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}\
.notice{background:#e8f5e9;border:1px solid #a5d6a7;padding:.5em .8em;margin:.6em 0}\
.error{background:#fdecea;border:1px solid #f5c2c0;padding:.5em .8em;margin:.6em 0}\
.muted{color:#667}.dead{color:#c62828;font-weight:600}.delivered{color:#2e7d32}.pending{color:#b45f06}\
form.filters{display:flex;flex-wrap:wrap;gap:.6em;align-items:flex-end;margin-bottom:1em}\
form.filters label,form.login label{display:flex;flex-direction:column;font-size:12px;color:#556}\
input,select,button{font:inherit;padding:.3em .5em}button{cursor:pointer}\
form.login{display:flex;flex-direction:column;gap:.8em;max-width:22em}\
section.card{background:#fff;border:1px solid #e3e6ea;padding:.6em 1em .8em;margin-bottom:1em}\
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:.2em 1.2em;margin:0}dl.facts dt{color:#556}dl.facts dd{margin:0}\
svg.chart{width:100%;max-width:780px;height:auto;display:block;margin:.4em 0}\
svg.chart text{font:10px system-ui,sans-serif;fill:#667}svg.chart line{stroke:#ccd}\
.processed{fill:#2e7d32;background:#2e7d32}.replayed{fill:#1976d2;background:#1976d2}\
.rejected{fill:#ef6c00;background:#ef6c00}.failed{fill:#c62828;background:#c62828}\
.legend span{margin-right:1.2em;white-space:nowrap}.sw{display:inline-block;width:.8em;height:.8em;margin-right:.35em;vertical-align:-.05em}\
nav.pages{margin-top:.8em;display:flex;gap:1.2em}\
div.row{display:flex;flex-wrap:wrap;gap:1em}div.row section.card{flex:1 1 20em;margin-bottom:0}";

/// A whole page: the header (with the logout form when logged in) and `main`.
pub fn page(title: &str, session: Option<&Session>, main: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                link rel="icon" href="data:,";
                title { (title) " · hookbox" }
                style { (PreEscaped(STYLE)) }
            }
            body {
                header {
                    span class="brand" { "hookbox" }
                    @if let Some(session) = session {
                        a href="/console" { "Overview" }
                        a href="/console/events" { "Events" }
                        form method="post" action="/console/logout" {
                            input type="hidden" name="csrf" value=(session.csrf());
                            button type="submit" id="logout" { "Log out" }
                        }
                    }
                }
                main { (main) }
            }
        }
    }
}

/// An HTML answer with the console's headers.
pub fn respond(status: StatusCode, html: Markup) -> HttpResponse {
    guarded(HttpResponse::build(status))
        .content_type("text/html; charset=utf-8")
        .body(html)
}

/// `303 See Other` to a console path.
pub fn redirect(location: &str) -> HttpResponse {
    guarded(HttpResponse::SeeOther())
        .insert_header((header::LOCATION, location))
        .finish()
}

/// The headers every console answer carries: no script, no framing, no caching of event
/// contents, and no referrer leaking event ids.
const GUARDS: [(header::HeaderName, &str); 5] = [
    (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
    (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    (header::X_FRAME_OPTIONS, "DENY"),
    (header::REFERRER_POLICY, "no-referrer"),
    (header::CACHE_CONTROL, "no-store"),
];

/// Adds the headers every console answer carries ([`GUARDS`]).
pub fn guarded(mut builder: actix_web::HttpResponseBuilder) -> actix_web::HttpResponseBuilder {
    for guard in GUARDS {
        builder.insert_header(guard);
    }
    builder
}

/// The same headers on whatever else the console's scope answers: the HTTP library's own
/// refusals (a form body past its limit is its 413), which no console code builds.
pub fn guards() -> actix_web::middleware::DefaultHeaders {
    GUARDS.into_iter().fold(
        actix_web::middleware::DefaultHeaders::new(),
        |headers, guard| headers.add(guard),
    )
}

/// An event id or type as the console shows it: a control or format character (a bidi
/// override, a zero width, a line separator) written as its escape (`\u{202e}`), so two ids
/// that read alike are told apart (`evt_ab_\u{202e}4321` is not `evt_ab_1234`). Letters of any
/// script, and the marks on them, are shown as they are; maud escapes the HTML.
pub fn visible(text: &str) -> String {
    crate::ids::ClientText::new(text, usize::MAX).to_string()
}

/// Text of many lines (a body, a header value) with what [`visible`] escapes, but for its line
/// breaks and tabs, and quotes and backslashes as they are (a JSON body is full of them): a bidi
/// override, a zero width or a blank-looking letter in a payload is shown as its escape, so what
/// the page shows reads as the bytes are.
pub fn visible_lines(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    crate::ids::write_escaped(&mut out, text, &['\n', '\r', '\t', '"', '\'', '\\'])
        .expect("writing to a String cannot fail");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_shows_format_characters_as_escapes_and_keeps_its_lines() {
        let body = "{\n  \"id\": \"a\u{202e}b\u{200b}c\",\n\t\"x\": \"caf\u{e9} \\\\ '\"\n}";
        assert_eq!(
            visible_lines(body),
            "{\n  \"id\": \"a\\u{202e}b\\u{200b}c\",\n\t\"x\": \"caf\u{e9} \\\\ '\"\n}"
        );
        // Blank-looking letters and spaces other than ASCII's, too.
        assert_eq!(
            visible_lines("a\u{2800}b\u{3164}c\u{a0}d"),
            "a\\u{2800}b\\u{3164}c\\u{a0}d"
        );
    }

    #[test]
    fn a_body_shows_combining_marks_on_their_letters_and_escapes_loose_ones() {
        assert_eq!(
            visible_lines("{\"hi\": \"भुगतान सफल\", \"vi\": \"toa\u{301}n\"}"),
            "{\"hi\": \"भुगतान सफल\", \"vi\": \"toa\u{301}n\"}"
        );
        // A mark after a quote, a backslash, a line break or a tab has nothing to sit on.
        assert_eq!(
            visible_lines("\"\u{301}\\\u{301}\n\u{301}\t\u{301}"),
            "\"\\u{301}\\\\u{301}\n\\u{301}\t\\u{301}"
        );
        assert_eq!(visible_lines("\u{301}x"), "\\u{301}x");
        assert_eq!(visible_lines("a\u{202e}b"), "a\\u{202e}b");
    }

    #[test]
    fn the_title_and_the_csrf_token_are_escaped_in_the_layout() {
        let hostile = r#"<script>alert(1)</script> "><b x='1'> &"#;
        let shown = page(hostile, None, html! { p { (hostile) } }).into_string();
        assert!(
            !shown.contains("<script>") && !shown.contains("<b "),
            "{shown}"
        );
        assert!(shown.contains(
            "<title>&lt;script&gt;alert(1)&lt;/script&gt; &quot;&gt;&lt;b x='1'&gt; &amp; · hookbox</title>"
        ));
        assert!(shown.starts_with("<!DOCTYPE html><html lang=\"en\">"));
    }

    #[test]
    fn a_deeply_nested_body_stays_the_size_it_came() {
        for depth in [100, 127, 128, 129, 5_000, 200_000] {
            let raw = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
            let started = std::time::Instant::now();
            let shown = show_body(raw.as_bytes());
            assert!(
                shown.text.len() <= 2 * raw.len() + 64 * 1024,
                "{depth}: {} bytes shown of {}",
                shown.text.len(),
                raw.len()
            );
            assert!(
                started.elapsed() < std::time::Duration::from_secs(2),
                "{depth}"
            );
        }
    }

    #[test]
    fn json_is_reindented_without_changing_anything_else() {
        let raw = r#"{"z":1,"a":{"s":"x, {y}: \"q\"","n":1.50,"e":[],"o":{ }},"l":[1,2]}"#;
        let shown = show_body(raw.as_bytes());
        assert_eq!(
            shown.text,
            "{\n  \"z\": 1,\n  \"a\": {\n    \"s\": \"x, {y}: \\\"q\\\"\",\n    \"n\": 1.50,\n    \"e\": [],\n    \"o\": {}\n  },\n  \"l\": [\n    1,\n    2\n  ]\n}"
        );
        let reparsed: serde_json::Value = serde_json::from_str(&shown.text).expect("still JSON");
        assert_eq!(
            reparsed,
            serde_json::from_str::<serde_json::Value>(raw).expect("JSON")
        );
    }

    #[test]
    fn text_is_shown_as_it_is_and_other_bytes_as_base64() {
        assert_eq!(show_body(b"a=1&b=<2>").text, "a=1&b=<2>");
        assert!(show_body(b"a=1").note.is_none());
        let binary = show_body(&[0xff, 0x00, 0x41]);
        assert_eq!(binary.text, "/wBB");
        assert_eq!(binary.note, Some("not UTF-8, shown as base64"));
    }

    #[test]
    fn links_encode_their_query() {
        assert_eq!(
            link(
                "/console/event",
                &[("source", "stripe"), ("id", "a&b c/<"), ("x", "")]
            ),
            "/console/event?source=stripe&id=a%26b+c%2F%3C"
        );
        assert_eq!(link("/console/events", &[("q", "")]), "/console/events");
    }
}
