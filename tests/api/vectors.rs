//! The signature vectors in `tests/vectors/signatures.json`, each checked against the provider's
//! own library or published example, run through the public API.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use hookbox::providers::{Provider, Scheme, SignatureError};
use hookbox::secret::Secret;
use serde::Deserialize;

#[derive(Deserialize)]
struct File {
    vectors: Vec<Vector>,
}

#[derive(Deserialize)]
struct Vector {
    scheme: String,
    source: String,
    secret: String,
    body: String,
    now: Option<i64>,
    headers: BTreeMap<String, String>,
    valid: bool,
}

/// The schemes a provider defines; `hmac-sha256` is configured per source and has no provider
/// truth to take vectors from.
const PROVIDER_SCHEMES: [&str; 5] = ["stripe", "standard", "github", "shopify", "slack"];

fn vectors_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors/signatures.json")
}

fn vectors() -> Vec<Vector> {
    let text = std::fs::read_to_string(vectors_path()).expect("the vectors file is readable");
    let file: File = serde_json::from_str(&text).expect("the vectors file parses");
    file.vectors
}

fn scheme(name: &str) -> Scheme {
    assert!(
        PROVIDER_SCHEMES.contains(&name),
        "the vectors name a scheme this test cannot build: {name:?}"
    );
    Scheme::builtin(name).expect("a built-in scheme")
}

fn verifier(vector: &Vector) -> std::sync::Arc<dyn Provider> {
    scheme(&vector.scheme)
        .build(
            &[Secret::new(vector.secret.clone())],
            Duration::from_secs(300),
        )
        .unwrap_or_else(|reason| panic!("{}: verifier refused: {reason}", vector.source))
}

fn headers(vector: &Vector) -> Vec<(String, String)> {
    vector
        .headers
        .iter()
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect()
}

/// The vector's value of header `name`, in any case.
fn header<'v>(vector: &'v Vector, name: &str) -> Option<&'v str> {
    vector
        .headers
        .iter()
        .find(|(header, _)| header.eq_ignore_ascii_case(name))
        .map(|(_, value)| value.as_str())
}

#[test]
fn every_vector_verifies_as_its_provider_says() {
    let mut failures = Vec::new();
    for vector in vectors() {
        let outcome = verifier(&vector).verify(
            &headers(&vector),
            vector.body.as_bytes(),
            vector.now.unwrap_or(0),
        );
        if outcome.is_ok() != vector.valid {
            failures.push(format!(
                "{} [{}]: expected {}, got {outcome:?}",
                vector.source,
                vector.scheme,
                if vector.valid { "valid" } else { "invalid" }
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "failed vectors:\n{}",
        failures.join("\n")
    );
}

#[test]
fn the_vectors_cover_every_provider_scheme_both_ways() {
    let vectors = vectors();
    for vector in &vectors {
        assert!(
            PROVIDER_SCHEMES.contains(&vector.scheme.as_str()),
            "{}: unknown scheme {:?}",
            vector.source,
            vector.scheme
        );
    }
    for name in PROVIDER_SCHEMES {
        assert!(
            vectors.iter().any(|v| v.scheme == name && v.valid),
            "no valid vector for {name}"
        );
    }
    assert!(vectors.iter().any(|v| v.valid), "no valid vector at all");
    assert!(vectors.iter().any(|v| !v.valid), "no invalid vector at all");
}

#[test]
fn a_valid_vector_with_one_body_byte_changed_is_invalid() {
    for vector in vectors().into_iter().filter(|v| v.valid) {
        let mut body = vector.body.clone().into_bytes();
        let last = body.last_mut().expect("vector bodies are not empty");
        *last ^= 0x01;
        let outcome = verifier(&vector).verify(&headers(&vector), &body, vector.now.unwrap_or(0));
        assert_eq!(outcome, Err(SignatureError::Invalid), "{}", vector.source);
    }
}

#[test]
fn a_valid_timestamped_vector_verified_too_late_is_stale() {
    for vector in vectors().into_iter().filter(|v| v.valid) {
        let Some(now) = vector.now else { continue };
        let outcome =
            verifier(&vector).verify(&headers(&vector), vector.body.as_bytes(), now + 301);
        assert_eq!(outcome, Err(SignatureError::Stale), "{}", vector.source);
    }
}

#[test]
fn sign_reproduces_a_provider_signature_for_every_scheme() {
    let mut reproduced = Vec::new();
    for vector in vectors().into_iter().filter(|v| v.valid) {
        let verifier = verifier(&vector);
        let id = header(&vector, "webhook-id").unwrap_or("unused");
        let now = vector.now.unwrap_or(0);
        let signed = verifier.sign(vector.body.as_bytes(), now, id, None);
        assert_eq!(
            verifier.verify(&signed, vector.body.as_bytes(), now),
            Ok(()),
            "{}",
            vector.source
        );
        // A vector listing several signatures cannot equal one `sign` output; the others must.
        // Headers the vector leaves out (GitHub's delivery id, say) are not compared.
        let (signature_name, signature) = &signed[0];
        if header(&vector, signature_name) == Some(signature.as_str())
            && signed
                .iter()
                .all(|(name, value)| header(&vector, name).is_none_or(|theirs| theirs == value))
        {
            reproduced.push(vector.scheme.clone());
        }
    }
    for name in PROVIDER_SCHEMES {
        assert!(
            reproduced.iter().any(|scheme| scheme == name),
            "sign never reproduced a {name} vector's headers"
        );
    }
}

/// Where the shared vectors are: `HOOKBOX_SHARED_VECTORS` (a folder, or `none` to say on purpose
/// that there is none to compare with), else `../shared/vectors` beside the checkout.
fn shared_vectors_dir() -> Option<PathBuf> {
    match std::env::var("HOOKBOX_SHARED_VECTORS") {
        Ok(value) if value == "none" => None,
        Ok(value) => Some(PathBuf::from(value)),
        Err(_) => Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/vectors")),
    }
}

/// The checked-in copies in `tests/vectors/` are the shared vectors, byte for byte, every file of
/// them. A missing shared folder fails the test rather than passing it unseen: say
/// `HOOKBOX_SHARED_VECTORS=none` where there is deliberately none (`.ci/run` does so on a clone
/// without it, and says so).
#[test]
fn the_checked_in_vectors_are_the_shared_vectors_byte_for_byte() {
    let Some(shared) = shared_vectors_dir() else {
        eprintln!("HOOKBOX_SHARED_VECTORS=none: the vector copies are not compared");
        return;
    };
    let entries = std::fs::read_dir(&shared).unwrap_or_else(|e| {
        panic!(
            "cannot read the shared vectors at {}: {e}; point HOOKBOX_SHARED_VECTORS at them, \
             or set it to `none` to skip the comparison on purpose",
            shared.display()
        )
    });
    let ours = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors");
    let mut compared = 0;
    for entry in entries {
        let path = entry.expect("a readable folder entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let name = path.file_name().expect("a file name");
        let copy = ours.join(name);
        let theirs = std::fs::read(&path).expect("the shared file is readable");
        let mine = std::fs::read(&copy)
            .unwrap_or_else(|e| panic!("{} has no copy in tests/vectors: {e}", path.display()));
        assert!(
            theirs == mine,
            "{} differs from {}",
            copy.display(),
            path.display()
        );
        compared += 1;
    }
    assert!(compared > 0, "no vector files in {}", shared.display());
}
