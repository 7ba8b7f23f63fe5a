//! Keeping the secrets of a database URL, or of a forward target's URL, out of everything
//! hookbox prints: startup logs, `migrate` output, connection errors and the errors a delivery
//! records (which the admin API and the console show) all go through here.
//!
//! A libpq URL carries a password in two places: the userinfo (`postgres://user:PW@host/db`)
//! and the query (`?password=PW`, `?sslpassword=PW`). Both are replaced with `***`. libpq's own
//! error messages can quote a piece of the URL (`invalid percent-encoded token: "PW%zz"`), so an
//! error about a URL is scrubbed of every secret value it names as well. A forward target's
//! URL (`https://user:PW@host`, `amqp://user:PW@host/vhost`) is masked the same way, and a
//! NATS URL's userinfo without a password (`nats://TOKEN@host`) is a token, masked whole.

/// What in a query parameter's name says its value is a secret, compared ignoring case: libpq's
/// `password` and `sslpassword`, and what a forward target's URL may carry (`?token=`,
/// `?api_key=`, `?access_token=`, `?secret=`, `?sig=`, `?auth=`).
const SECRET_PARAMETERS: &[&str] = &["pass", "token", "key", "secret", "sig", "auth"];

/// Headers hookbox never keeps with an event, nor writes into a capture, whatever a scheme
/// reads: credentials of the sender's own.
pub const CREDENTIAL_HEADERS: [&str; 4] = [
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
];

/// Takes the [`CREDENTIAL_HEADERS`] out of a kept headers object (names compared ignoring
/// case).
pub fn drop_credentials(headers: &mut serde_json::Value) {
    if let Some(headers) = headers.as_object_mut() {
        headers.retain(|name, _| {
            !CREDENTIAL_HEADERS
                .iter()
                .any(|credential| name.eq_ignore_ascii_case(credential))
        });
    }
}

/// What a secret is shown as.
const MASK: &str = "***";

/// `url` with the userinfo password and every secret-bearing query parameter's value replaced
/// with `***`; the rest (user, host, database, other parameters) is kept so the URL still says
/// where it points.
pub fn database_url(url: &str) -> String {
    let parts = Parts::of(url);
    let mut shown = String::with_capacity(url.len());
    shown.push_str(&url[..parts.authority_start]);
    match parts.password {
        Some((start, end)) => {
            shown.push_str(&url[parts.authority_start..start]);
            shown.push_str(MASK);
            shown.push_str(&url[end..parts.query_start]);
        }
        None => shown.push_str(&url[parts.authority_start..parts.query_start]),
    }
    if parts.query_start < url.len() {
        // The '?' itself, then each pair with a secret's value masked.
        shown.push('?');
        let query = &url[parts.query_start + 1..];
        for (i, pair) in query.split('&').enumerate() {
            if i > 0 {
                shown.push('&');
            }
            match pair.split_once('=') {
                Some((key, _)) if is_secret_parameter(key) => {
                    shown.push_str(key);
                    shown.push('=');
                    shown.push_str(MASK);
                }
                _ => shown.push_str(pair),
            }
        }
    }
    shown
}

/// The name of an environment variable a `*_env` key names, as an error may show it: as written
/// when it is written like a variable name (`A-Z`, `0-9`, `_`, not starting with a digit);
/// otherwise not at all. A `secrets_env = "whsec_..."` is a secret put under the wrong key, and
/// the error saying that no such variable is set must not repeat it.
pub fn variable_name(name: &str) -> String {
    let conventional = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
    if conventional {
        name.to_owned()
    } else {
        "named there (its name is not shown: it is not written like one, in A-Z 0-9 _, and may \
         be a secret under the wrong key)"
            .to_owned()
    }
}

/// A forward target's `url` as it may be shown: see [`database_url`]; a `nats://` URL's token
/// (a userinfo with no password) is masked too.
pub fn target_url(url: &str) -> String {
    database_url(url)
}

/// A secret shorter than this is masked only where it stands alone (between characters that
/// are not letters or digits): masked inside words, a password `e` made `conn***ction` of every
/// message, and the stars said what the password was.
const SHORT_SECRET: usize = 8;

/// `message` (an error about connecting to `url`) with `url` shown redacted and every secret
/// value of `url` (as written, and percent-decoded) replaced with `***` wherever else it appears
/// (a short one where it stands alone; see [`SHORT_SECRET`]). The redacted URL itself is left
/// as it is: its host and port are not a password's hiding place.
pub fn message_about(message: &str, url: &str) -> String {
    let mut secrets = secrets(url);
    // Longest first, so a secret that contains another is masked whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let shown_url = database_url(url);
    let pieces: Vec<String> = message
        .split(url)
        .map(|piece| {
            secrets
                .iter()
                .fold(piece.to_owned(), |piece, secret| masked(&piece, secret))
        })
        .collect();
    pieces.join(&shown_url)
}

/// `text` with `secret` replaced by `***`: everywhere when it is long enough to be no word's
/// part by chance, else only where it stands alone.
fn masked(text: &str, secret: &str) -> String {
    if secret.len() >= SHORT_SECRET {
        return text.replace(secret, MASK);
    }
    let word = |c: Option<char>| c.is_some_and(char::is_alphanumeric);
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(secret) {
        let (before, after) = (&rest[..at], &rest[at + secret.len()..]);
        let alone = !word(before.chars().next_back()) && !word(after.chars().next());
        out.push_str(before);
        out.push_str(if alone { MASK } else { secret });
        rest = after;
    }
    out.push_str(rest);
    out
}

/// Every secret value `url` holds, as written and percent-decoded; no empty ones.
fn secrets(url: &str) -> Vec<String> {
    let parts = Parts::of(url);
    let mut raw: Vec<&str> = Vec::new();
    if let Some((start, end)) = parts.password {
        let password = &url[start..end];
        raw.push(password);
        // libpq splits a URL at an unencoded '/' or '?' where hookbox masks a password whole,
        // and then quotes a piece of it as another part (a base64 password `Zm9v/YmFy` read
        // as host `u:Zm9v`: `invalid integer value "Zm9v" for connection option "port"`).
        raw.extend(
            password
                .split(['/', '?', '@', ':'])
                .filter(|piece| piece.len() < password.len()),
        );
    }
    if parts.query_start < url.len() {
        for pair in url[parts.query_start + 1..].split('&') {
            if let Some((key, value)) = pair.split_once('=') {
                if is_secret_parameter(key) {
                    raw.push(value);
                }
            }
        }
    }
    let mut all = Vec::new();
    for value in raw {
        for candidate in [value.to_owned(), percent_decoded(value)] {
            if !candidate.is_empty() && !all.contains(&candidate) {
                all.push(candidate);
            }
        }
    }
    all
}

fn is_secret_parameter(key: &str) -> bool {
    let key = percent_decoded(key).to_ascii_lowercase();
    SECRET_PARAMETERS.iter().any(|secret| key.contains(secret))
}

/// `%XX` sequences decoded (as libpq does); a malformed one is left as written.
pub fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|pair| {
            std::str::from_utf8(pair)
                .ok()
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
        });
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The query of `url` (after its '?', which is not part of it), where it has one: the first
/// '?' past the userinfo, so a password holding one is not taken for it.
pub fn query_of(url: &str) -> Option<&str> {
    let start = Parts::of(url).query_start;
    url.get(start..).and_then(|rest| rest.strip_prefix('?'))
}

/// For a password holding both an unencoded '?' and '/' (`u:a?b/c@h/db`), which neither
/// reading above finds: the last '@' followed by what can only be a host (up to the next '/'
/// or the end: no '?', '&' or '='), with a `user:` before it. An '@' in a query value
/// (`?application_name=me@x`) can be taken for one: then more is masked, never less.
fn userinfo_past_both(rest: &str) -> Option<usize> {
    let at = rest.rfind('@')?;
    let host = &rest[at + 1..];
    let host = &host[..host.find('/').unwrap_or(host.len())];
    let user = &rest[..at];
    let user = &user[..user.find(':')?];
    let plain = |text: &str| !text.contains(['?', '&', '=', '/']);
    (plain(host) && plain(user)).then_some(at)
}

/// Where the pieces of a URL are, as byte offsets.
struct Parts {
    /// Just past `scheme://` (0 when there is none).
    authority_start: usize,
    /// The userinfo password's span, without the ':' and the '@'.
    password: Option<(usize, usize)>,
    /// The '?' that starts the query, or the URL's length when there is none.
    query_start: usize,
}

impl Parts {
    fn of(url: &str) -> Parts {
        let authority_start = url.find("://").map_or(0, |i| i + 3);
        let rest = &url[authority_start..];
        // libpq's reading first: the userinfo runs to the last '@' before the first '/', so a
        // password may hold an unencoded '?' (`u:ab?c@h/db`, which libpq takes). Else to the
        // last '@' before the query: a password holding an unencoded '/' (base64 ones do),
        // which libpq cannot read, is then masked whole all the same, and an '@' in a query
        // value is not taken for one.
        let before_path = rest.find('/').unwrap_or(rest.len());
        let before_query = rest.find('?').unwrap_or(rest.len());
        // The later of the two: a password may hold '@' and '/' both (`u:a@b/c@h/db`).
        let userinfo_end = rest[..before_path]
            .rfind('@')
            .max(rest[..before_query].rfind('@'))
            .or_else(|| userinfo_past_both(rest));
        let is_nats = url
            .get(..authority_start)
            .is_some_and(|scheme| scheme.eq_ignore_ascii_case("nats://"));
        let password = userinfo_end.and_then(|at| match rest[..at].find(':') {
            Some(colon) => Some((authority_start + colon + 1, authority_start + at)),
            // NATS reads a userinfo without a password as a token.
            None if is_nats && at > 0 => Some((authority_start, authority_start + at)),
            None => None,
        });
        // The query starts at the first '?' past the userinfo.
        let after_userinfo = userinfo_end.map_or(0, |at| at + 1);
        let query_start = authority_start
            + after_userinfo
            + rest[after_userinfo..]
                .find('?')
                .unwrap_or(rest.len() - after_userinfo);
        Parts {
            authority_start,
            password,
            query_start,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userinfo_and_query_passwords_are_masked_and_the_rest_kept() {
        let cases = [
            ("postgres://u:pw@h/db", "postgres://u:***@h/db"),
            (
                "postgres://u@h/db?password=pw",
                "postgres://u@h/db?password=***",
            ),
            (
                "postgres://u@h:5432/db?sslmode=require&sslpassword=k&password=p",
                "postgres://u@h:5432/db?sslmode=require&sslpassword=***&password=***",
            ),
            (
                "postgresql://u:p@h?PassWord=x",
                "postgresql://u:***@h?PassWord=***",
            ),
            (
                "postgres://u@h/db?pass%77ord=pw",
                "postgres://u@h/db?pass%77ord=***",
            ),
            ("postgres://u:p@ss@h/db", "postgres://u:***@h/db"),
            ("postgres://u:ab/c+d==@h/db", "postgres://u:***@h/db"),
            (
                "postgres://postgres:ab?PW@127.0.0.1:5432/db?sslmode=disable",
                "postgres://postgres:***@127.0.0.1:5432/db?sslmode=disable",
            ),
            // '@' and '/', and '?' and '/', in a password, in either order.
            (
                "amqp://guest:Q1mk@Q2mk/Q3mk@h:5672/v",
                "amqp://guest:***@h:5672/v",
            ),
            ("nats://u:Q1mk@Q2mk/Q3mk@h:4222", "nats://u:***@h:4222"),
            (
                "postgres://u:Q2mk?Q3/mk@h/db?x=1",
                "postgres://u:***@h/db?x=1",
            ),
            ("postgres://u:Q2mk/Q3?mk@h/db", "postgres://u:***@h/db"),
            (
                "amqp://guest:g?st@h:5672/%2f",
                "amqp://guest:***@h:5672/%2f",
            ),
            (
                "postgres://u@h/db?application_name=a/b@c&password=pw",
                "postgres://u@h/db?application_name=a/b@c&password=***",
            ),
            (
                "postgres://h/db?application_name=me@x&password=pw",
                "postgres://h/db?application_name=me@x&password=***",
            ),
            ("postgres://h/db", "postgres://h/db"),
            (
                "postgres://u@h/db?application_name=x",
                "postgres://u@h/db?application_name=x",
            ),
            ("sqlite://hookbox.db", "sqlite://hookbox.db"),
            ("sqlite::memory:", "sqlite::memory:"),
            (
                "amqp://guest:gu%40st@127.0.0.1:5672/%2f",
                "amqp://guest:***@127.0.0.1:5672/%2f",
            ),
            ("nats://s3cr3t-token@h:4222", "nats://***@h:4222"),
            ("nats://u:pw@h:4222", "nats://u:***@h:4222"),
            ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
            ("https://u:pw@h/hooks?x=1", "https://u:***@h/hooks?x=1"),
            ("http://user@h/hooks", "http://user@h/hooks"),
            // A forward target's query credentials.
            (
                "https://h/hooks?token=t0k&x=1&api_key=k&Access_Token=a&sig=s",
                "https://h/hooks?token=***&x=1&api_key=***&Access_Token=***&sig=***",
            ),
            ("https://h/hooks?secret=s", "https://h/hooks?secret=***"),
        ];
        for (url, shown) in cases {
            assert_eq!(target_url(url), shown, "{url}");
        }
    }

    #[test]
    fn a_message_quoting_a_secret_shows_it_masked() {
        let url = "postgres://u:top%21secret@h/db?sslpassword=abc%zzkey";
        let message = format!(
            "at {url}: invalid percent-encoded token: \"abc%zzkey\"; password top!secret refused"
        );
        let scrubbed = message_about(&message, url);
        assert!(!scrubbed.contains("secret"), "{scrubbed}");
        assert!(!scrubbed.contains("zzkey"), "{scrubbed}");
        assert!(
            scrubbed.contains("postgres://u:***@h/db?sslpassword=***"),
            "{scrubbed}"
        );
    }

    #[test]
    fn the_query_starts_past_the_userinfo() {
        assert_eq!(query_of("postgres://u:a?b@h/db"), None);
        assert_eq!(query_of("postgres://u:a?b@h/db?x=1"), Some("x=1"));
        assert_eq!(query_of("postgres://h/db?"), Some(""));
        assert_eq!(query_of("postgres://h/db"), None);
    }

    #[test]
    fn a_piece_of_a_password_libpq_quotes_as_another_part_is_masked() {
        // libpq reads `u:Zm9vYmFyYmF6cXV4` as host and port, the rest as the database.
        let url = "postgres://u:Zm9vYmFyYmF6cXV4/cXV1eA==@h:5432/db";
        let message = "invalid integer value \"Zm9vYmFyYmF6cXV4\" for connection option \"port\"";
        let scrubbed = message_about(message, url);
        assert!(!scrubbed.contains("Zm9vYmFyYmF6cXV4"), "{scrubbed}");
        let message = format!("database \"cXV1eA==@h:5432/db\" does not exist at {url}");
        let scrubbed = message_about(&message, url);
        assert!(!scrubbed.contains("cXV1eA"), "{scrubbed}");
        assert!(
            scrubbed.contains("postgres://u:***@h:5432/db"),
            "{scrubbed}"
        );
    }

    #[test]
    fn a_short_secret_is_masked_where_it_stands_alone_and_never_inside_the_shown_url() {
        let url = "postgres://u:e@127.0.0.1:5432/db";
        let message = format!("connection to server at {url} failed: password \"e\" refused");
        assert_eq!(
            message_about(&message, url),
            "connection to server at postgres://u:***@127.0.0.1:5432/db failed: password \"***\" \
             refused"
        );
        let url = "http://user:1@127.0.0.1:18320/";
        let message = format!("{url} is refused: 1 is not a port");
        assert_eq!(
            message_about(&message, url),
            "http://user:***@127.0.0.1:18320/ is refused: *** is not a port"
        );
        let url = "postgres://u:TCP@h/db";
        assert_eq!(
            message_about("TCP/IP connections refused", url),
            "***/IP connections refused",
            "standing alone, a short secret is masked all the same"
        );
    }
}
