//! Square: `x-square-hmacsha256-signature`, the base64 HMAC-SHA256 of the notification URL as
//! registered with Square followed by the body, keyed by the subscription's signature key, used
//! as text. The URL is the source's `public_url`: a proxy in front of hookbox changes the URL it
//! sees, never the one Square signed. No timestamp is signed.

use std::sync::Arc;
use std::time::Duration;

use super::family::{HeaderMac, TagText};
use super::mac::json_text;
use super::{Headers, Identity, Keys, Provider, ProviderError, Settings, SignatureError};

/// A Square source: its signature keys, as text, and the URL Square signs.
#[derive(Debug)]
pub struct Square {
    keys: Keys,
    public_url: String,
}

/// Builds a Square source from its required `public_url`.
pub(super) fn build(settings: &Settings<'_>) -> Result<Arc<dyn Provider>, ProviderError> {
    settings.only(&["public_url"])?;
    let public_url = settings.text("public_url")?.ok_or_else(|| {
        ProviderError::at(
            "public_url",
            "a square source needs `public_url`: the notification URL exactly as registered \
             with Square, which Square signs with the body",
        )
    })?;
    if !(public_url.starts_with("https://") || public_url.starts_with("http://")) {
        return Err(ProviderError::at(
            "public_url",
            "expected an http:// or https:// URL, as registered with Square",
        ));
    }
    Ok(Arc::new(Square {
        keys: Keys::as_text(settings.scheme, settings.secrets)?,
        public_url: public_url.to_owned(),
    }))
}

/// One base64 signature of the URL followed by the body.
const SIGNATURE: HeaderMac = HeaderMac {
    header: "x-square-hmacsha256-signature",
    prefix: "",
    text: TagText::Base64,
};

impl Provider for Square {
    fn scheme(&self) -> &'static str {
        "square"
    }

    /// It signs no timestamp: a `tolerance` would go unused.
    fn checks_timestamp(&self) -> bool {
        false
    }

    fn verify(&self, headers: &dyn Headers, body: &[u8], _now: i64) -> Result<(), SignatureError> {
        SIGNATURE.verify(&self.keys, headers, &[self.public_url.as_bytes(), body])
    }

    fn needs_json(&self) -> bool {
        true
    }

    fn identify(&self, _headers: &dyn Headers, json: Option<&serde_json::Value>) -> Identity {
        Identity {
            event_id: json_text(json, "/event_id"),
            event_type: json_text(json, "/type"),
        }
    }

    fn kept_headers(&self) -> Vec<String> {
        vec![SIGNATURE.header.to_owned()]
    }

    fn sign(
        &self,
        body: &[u8],
        _timestamp: i64,
        _event_id: &str,
        _event_type: Option<&str>,
    ) -> Vec<(String, String)> {
        vec![SIGNATURE.sign(&self.keys, &[self.public_url.as_bytes(), body])]
    }

    fn redelivery_horizon(&self) -> Option<(Duration, &'static str)> {
        Some((
            Duration::from_secs(24 * 3600),
            "Square retries an unsuccessful delivery for up to 24 hours, then discards it",
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::{Registry, SignatureError};
    use crate::secret::Secret;

    const BODY: &[u8] = br#"{"type":"payment.updated","event_id":"6a8f"}"#;

    fn square(url: &str, secrets: &[&str]) -> std::sync::Arc<dyn super::super::Provider> {
        let mut table = toml::Table::new();
        table.insert("public_url".into(), url.into());
        let secrets: Vec<Secret> = secrets.iter().map(|s| Secret::new(*s)).collect();
        Registry::builtin()
            .scheme("square", Some(table))
            .expect("built in")
            .build(&secrets, Duration::from_secs(300))
            .expect("valid")
    }

    #[test]
    fn the_url_is_signed_with_the_body() {
        let url = "https://hooks.example.com/webhooks/square";
        let signed = square(url, &["key"]).sign(BODY, 0, "", None);
        assert_eq!(
            square(url, &["old", "key"]).verify(&signed, BODY, 0),
            Ok(())
        );
        let other = square("https://hooks.example.com/webhooks/other", &["key"]);
        assert_eq!(other.verify(&signed, BODY, 0), Err(SignatureError::Invalid));
        assert_eq!(
            square(url, &["key"]).verify(&signed, b"{}", 0),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn public_url_is_required_and_must_be_a_url() {
        let secrets = [Secret::new("key")];
        let scheme = Registry::builtin()
            .scheme("square", None)
            .expect("built in");
        let error = scheme
            .build(&secrets, Duration::from_secs(300))
            .unwrap_err();
        assert_eq!(error.key, "public_url");
        let mut table = toml::Table::new();
        table.insert("public_url".into(), "hooks.example.com/square".into());
        let scheme = Registry::builtin()
            .scheme("square", Some(table))
            .expect("built in");
        let error = scheme
            .build(&secrets, Duration::from_secs(300))
            .unwrap_err();
        assert_eq!(error.key, "public_url");
    }
}
