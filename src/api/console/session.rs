//! The console's sign-in session: a cookie that names the principal and when the session
//! ends, signed with HMAC-SHA256 (the `cookie` crate's signed jar), never the token it was
//! opened with. It is `HttpOnly` (no script reads it), `SameSite=Strict` (no other site's page
//! sends it), `Secure` when the gateway serves HTTPS, scoped to `/ui/`, and expires both in
//! the browser (`Max-Age`) and here (the signed end time). The principal it names is looked up
//! in the principals in force on every request, so a principal removed from the file loses its
//! sessions at the next reload.

use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, header};
use chrono::{DateTime, Utc};
use cookie::{Cookie, CookieJar, Key, SameSite};

/// The cookie's name.
pub(crate) const SESSION_COOKIE: &str = "filament_session";

/// The path the cookie is sent for.
const COOKIE_PATH: &str = "/ui/";

/// Bytes a key file must hold at least (the HKDF input of the signing key).
pub(crate) const MIN_KEY_FILE_BYTES: usize = 32;

/// Issues and checks session cookies.
#[derive(Clone)]
pub(crate) struct ConsoleSessions {
    key: Key,
    lifetime: Duration,
    /// `Secure` cookies: the gateway serves HTTPS.
    secure: bool,
}

impl std::fmt::Debug for ConsoleSessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key is a credential: never printed.
        f.debug_struct("ConsoleSessions").field("lifetime", &self.lifetime).field("secure", &self.secure).finish()
    }
}

/// Why a request has no session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoSession {
    /// No session cookie: never signed in, or signed out.
    Absent,
    /// The cookie's signature does not verify (another key, or altered).
    Forged,
    /// The session ended.
    Expired,
}

impl NoSession {
    /// The reason `audit.denied` records.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            NoSession::Absent => "no_session",
            NoSession::Forged => "session_signature_invalid",
            NoSession::Expired => "session_expired",
        }
    }
}

impl ConsoleSessions {
    /// Sessions signed with a key derived from `key_material` (the key file's bytes, at least
    /// [`MIN_KEY_FILE_BYTES`], checked by the caller), or with a random key of this process.
    pub(crate) fn new(key_material: Option<&[u8]>, lifetime: Duration, secure: bool) -> Self {
        let key = match key_material {
            Some(material) => Key::derive_from(material),
            None => Key::generate(),
        };
        Self { key, lifetime, secure }
    }

    /// The `Set-Cookie` value of a new session of `principal`, opened at `now`.
    pub(crate) fn open(&self, principal: &str, now: DateTime<Utc>) -> HeaderValue {
        let ends_at = now + chrono::Duration::from_std(self.lifetime).unwrap_or(chrono::Duration::hours(8));
        let mut jar = CookieJar::new();
        jar.signed_mut(&self.key).add(Cookie::new(SESSION_COOKIE, format!("{}.{principal}", ends_at.timestamp())));
        let signed = jar.get(SESSION_COOKIE).map(|c| c.value().to_string()).unwrap_or_default();
        let max_age = cookie::time::Duration::seconds(i64::try_from(self.lifetime.as_secs()).unwrap_or(i64::MAX));
        self.header(Cookie::build((SESSION_COOKIE, signed)).max_age(max_age))
    }

    /// The `Set-Cookie` value that ends the session in the browser.
    pub(crate) fn close(&self) -> HeaderValue {
        self.header(Cookie::build((SESSION_COOKIE, "")).max_age(cookie::time::Duration::ZERO))
    }

    fn header(&self, cookie: cookie::CookieBuilder<'static>) -> HeaderValue {
        let cookie = cookie.path(COOKIE_PATH).http_only(true).same_site(SameSite::Strict).secure(self.secure).build();
        // Names, signed values (base64 and `[0-9a-z._-]`) and attributes are visible ASCII.
        HeaderValue::from_str(&cookie.to_string()).unwrap_or_else(|_| HeaderValue::from_static(""))
    }

    /// The principal the request's session names, if it is signed with this key and has not
    /// ended at `now`.
    pub(crate) fn principal_of(&self, headers: &HeaderMap, now: DateTime<Utc>) -> Result<String, NoSession> {
        let mut jar = CookieJar::new();
        let presented = headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(Cookie::split_parse)
            .filter_map(Result::ok)
            .find(|cookie| cookie.name() == SESSION_COOKIE && !cookie.value().is_empty())
            .ok_or(NoSession::Absent)?;
        jar.add_original(presented.into_owned());
        let verified = jar.signed(&self.key).get(SESSION_COOKIE).ok_or(NoSession::Forged)?;
        let (ends_at, principal) = verified.value().split_once('.').ok_or(NoSession::Forged)?;
        let ends_at: i64 = ends_at.parse().map_err(|_| NoSession::Forged)?;
        if now.timestamp() >= ends_at {
            return Err(NoSession::Expired);
        }
        Ok(principal.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request_with(set_cookie: &HeaderValue) -> HeaderMap {
        // A browser sends back the name=value part of Set-Cookie.
        let pair = set_cookie.to_str().unwrap().split(';').next().unwrap().to_string();
        let mut headers = HeaderMap::new();
        headers.insert(header::COOKIE, HeaderValue::from_str(&format!("other=1; {pair}")).unwrap());
        headers
    }

    #[test]
    fn a_session_names_its_principal_until_it_ends() {
        let sessions = ConsoleSessions::new(Some(&[7u8; 32]), Duration::from_secs(3600), true);
        let now = Utc::now();
        let set_cookie = sessions.open("acme", now);
        let text = set_cookie.to_str().unwrap();
        for attribute in ["HttpOnly", "SameSite=Strict", "Secure", "Path=/ui/", "Max-Age=3600"] {
            assert!(text.contains(attribute), "{attribute} missing from {text}");
        }
        assert!(!text.contains("fbq_"), "the cookie carries no token: {text}");
        let headers = request_with(&set_cookie);
        assert_eq!(sessions.principal_of(&headers, now).unwrap(), "acme");
        assert_eq!(sessions.principal_of(&headers, now + chrono::Duration::seconds(3600)), Err(NoSession::Expired));
    }

    #[test]
    fn a_session_of_another_key_or_altered_is_refused() {
        let sessions = ConsoleSessions::new(Some(&[7u8; 32]), Duration::from_secs(3600), false);
        let other = ConsoleSessions::new(Some(&[8u8; 32]), Duration::from_secs(3600), false);
        let now = Utc::now();
        let set_cookie = other.open("acme", now);
        assert!(!set_cookie.to_str().unwrap().contains("Secure"));
        assert_eq!(sessions.principal_of(&request_with(&set_cookie), now), Err(NoSession::Forged));
        let genuine = sessions.open("acme", now);
        let altered = HeaderValue::from_str(&genuine.to_str().unwrap().replace(".acme", ".root")).unwrap();
        assert_eq!(sessions.principal_of(&request_with(&altered), now), Err(NoSession::Forged));
        assert_eq!(sessions.principal_of(&HeaderMap::new(), now), Err(NoSession::Absent));
        assert_eq!(sessions.principal_of(&request_with(&sessions.close()), now), Err(NoSession::Absent));
    }
}
