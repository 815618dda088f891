//! How nginx buffers and rewrites what it proxies: buffer sizes, request
//! bodies, `Set-Cookie` and `Location` rewriting, the HTTP version and the
//! retry deadline. The ConfigMap sets them for every location (rendered
//! once in `http {}`); annotations override them for one location (only
//! what an Ingress sets is rendered in its locations, so the others pay
//! nothing).
//!
//! Sizes are bounded tighter than nginx bounds them: a buffer is memory a
//! worker allocates for each request, and on a shared edge one tenant's
//! `proxy-buffers-number: 100000` must not be everyone's out-of-memory.

use serde::Serialize;

use super::values::{Invalid, RedirectUrl, Seconds, Size, UrlPath};

/// Largest `proxy-buffer-size` and single proxy buffer.
pub const MAX_BUFFER: u64 = 1 << 20;
/// Largest total of `proxy_buffers` (number × size) for one request.
pub const MAX_BUFFERS_TOTAL: u64 = 16 << 20;
/// Largest `client-body-buffer-size`: a request body up to this size is
/// held in memory instead of a temporary file.
pub const MAX_BODY_BUFFER: u64 = 16 << 20;
/// Largest `proxy-max-temp-file-size` (nginx's default is 1g).
pub const MAX_TEMP_FILE: u64 = 8 << 30;

/// A size for one buffer: at least 1k (nginx needs room for a status line
/// and headers), at most [`MAX_BUFFER`].
pub fn buffer_size(v: &str, what: &str) -> Result<Size, Invalid> {
    let s = Size::parse(v)?;
    if !(1024..=MAX_BUFFER).contains(&s.bytes()) {
        return Err(Invalid(format!("{what} must be between 1k and 1m: {v:?}")));
    }
    Ok(s)
}

pub fn body_buffer_size(v: &str) -> Result<Size, Invalid> {
    let s = Size::parse(v)?;
    if !(1024..=MAX_BODY_BUFFER).contains(&s.bytes()) {
        return Err(Invalid(format!(
            "client-body-buffer-size must be between 1k and 16m: {v:?}"
        )));
    }
    Ok(s)
}

pub fn buffers_number(v: &str) -> Result<u32, Invalid> {
    super::values::number_in(v, 2..=256, "proxy-buffers-number")
}

pub fn max_temp_file_size(v: &str) -> Result<Size, Invalid> {
    let s = Size::parse(v)?;
    if s.bytes() > MAX_TEMP_FILE {
        return Err(Invalid(format!("proxy-max-temp-file-size must be at most 8g: {v:?}")));
    }
    Ok(s)
}

/// `proxy_buffers`, `proxy_buffer_size`, `proxy_busy_buffers_size` and
/// `proxy_max_temp_file_size` as nginx merges them for one location, checked
/// as `ngx_http_proxy_merge_loc_conf` checks them (a combination it refuses
/// would fail `nginx -t` and hold back every other change), and against
/// [`MAX_BUFFERS_TOTAL`].
pub fn check_buffers(
    buffer_size: &Size,
    number: u32,
    busy: Option<&Size>,
    max_temp_file: Option<&Size>,
) -> Result<(), Invalid> {
    // ingress-nginx renders `proxy_buffers <number> <proxy-buffer-size>`.
    let size = buffer_size.bytes();
    let total = u64::from(number) * size;
    if total > MAX_BUFFERS_TOTAL {
        return Err(Invalid(format!(
            "proxy-buffers-number × proxy-buffer-size is {total} bytes per request; at most 16m"
        )));
    }
    let busy = busy.map_or(2 * size, Size::bytes);
    if busy < size {
        return Err(Invalid(format!(
            "proxy-busy-buffers-size ({busy} bytes) must be at least proxy-buffer-size ({size} bytes)"
        )));
    }
    if busy > u64::from(number - 1) * size {
        return Err(Invalid(format!(
            "proxy-busy-buffers-size ({busy} bytes{}) must not exceed proxy-buffers-number - 1 buffers ({} bytes)",
            if busy == 2 * size {
                ", nginx's default of two buffers"
            } else {
                ""
            },
            u64::from(number - 1) * size
        )));
    }
    if let Some(t) = max_temp_file.map(Size::bytes).filter(|t| *t != 0 && *t < size) {
        return Err(Invalid(format!(
            "proxy-max-temp-file-size ({t} bytes) must be 0 or at least proxy-buffer-size ({size} bytes)"
        )));
    }
    Ok(())
}

/// `proxy-http-version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum HttpVersion {
    #[serde(rename = "1.0")]
    V10,
    #[serde(rename = "1.1")]
    V11,
}

impl HttpVersion {
    pub fn parse(v: &str) -> Result<Self, Invalid> {
        match v.trim() {
            "1.0" => Ok(HttpVersion::V10),
            "1.1" => Ok(HttpVersion::V11),
            _ => Err(Invalid(format!("proxy-http-version must be 1.0 or 1.1: {v:?}"))),
        }
    }
}

/// `proxy_cookie_domain` / `proxy_cookie_path`: `off`, or what to replace
/// and its replacement. It reaches the template as its list of nginx
/// tokens (`["off"]`, `[from, to]`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Rewrite {
    Off,
    Replace { from: String, to: String },
}

impl Rewrite {
    /// `off`, or `FROM TO`, each checked by `token`.
    fn parse(v: &str, what: &str, token: impl Fn(&str) -> bool) -> Result<Self, Invalid> {
        if v.chars().any(char::is_control) {
            return Err(Invalid(format!("{what} has a control character: {v:?}")));
        }
        let words: Vec<&str> = v.split_whitespace().collect();
        match words.as_slice() {
            ["off"] => Ok(Rewrite::Off),
            [from, to] if token(from) && token(to) => Ok(Rewrite::Replace {
                from: from.to_string(),
                to: to.to_string(),
            }),
            _ => Err(Invalid(format!("{what} must be \"off\" or two values, FROM TO: {v:?}"))),
        }
    }

    /// `proxy-cookie-domain`: domains (a leading `.` allowed).
    pub fn cookie_domain(v: &str) -> Result<Self, Invalid> {
        Self::parse(v, "proxy-cookie-domain", |t| {
            let d = t.strip_prefix('.').unwrap_or(t);
            !d.is_empty() && d.len() <= 253 && d.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        })
    }

    /// `proxy-cookie-path`: plain URL paths.
    pub fn cookie_path(v: &str) -> Result<Self, Invalid> {
        Self::parse(v, "proxy-cookie-path", |t| UrlPath::parse(t).is_ok())
    }

    pub fn is_off(&self) -> bool {
        matches!(self, Rewrite::Off)
    }
}

/// `proxy_redirect`: ingress-nginx's `proxy-redirect-from`/`-to`. Its
/// default is `off` (nginx's own default, `default`, would rewrite the
/// `Location` of a backend that answers with the upstream's name). Like
/// [`Rewrite`], it reaches the template as its tokens.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ProxyRedirect {
    Off,
    Default,
    Replace { from: String, to: String },
}

impl Serialize for Rewrite {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Rewrite::Off => ["off"].serialize(s),
            Rewrite::Replace { from, to } => [from, to].serialize(s),
        }
    }
}

impl Serialize for ProxyRedirect {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            ProxyRedirect::Off => ["off"].serialize(s),
            ProxyRedirect::Default => ["default"].serialize(s),
            ProxyRedirect::Replace { from, to } => [from, to].serialize(s),
        }
    }
}

/// A `proxy_redirect` operand: an http(s) URL or a plain path.
fn redirect_operand(t: &str) -> bool {
    RedirectUrl::parse(t).is_ok() || UrlPath::parse(t).is_ok()
}

impl ProxyRedirect {
    /// ingress-nginx's rule: `from` of `off` or `default` stands alone;
    /// otherwise a replacement needs a `to` that is not `off` (else
    /// nothing is rendered, and the http-level setting applies).
    pub fn parse(from: &str, to: Option<&str>) -> Result<Option<Self>, Invalid> {
        match (from.trim(), to.map(str::trim)) {
            ("off", _) => Ok(Some(ProxyRedirect::Off)),
            ("default", _) => Ok(Some(ProxyRedirect::Default)),
            (_, None | Some("off")) => Ok(None),
            (f, Some(t)) if redirect_operand(f) && redirect_operand(t) => Ok(Some(ProxyRedirect::Replace {
                from: f.to_string(),
                to: t.to_string(),
            })),
            _ => Err(Invalid(format!(
                "proxy-redirect-from/-to must be off, default, or an http(s) URL or path each: {from:?} {to:?}"
            ))),
        }
    }
}

/// The ConfigMap's values, rendered in `http {}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct ProxyDefaults {
    pub buffer_size: Size,
    pub buffers_number: u32,
    pub busy_buffers_size: Option<Size>,
    pub request_buffering: bool,
    pub client_body_buffer_size: Size,
    pub cookie_domain: Rewrite,
    pub cookie_path: Rewrite,
    pub redirect: ProxyRedirect,
    /// 0: no deadline.
    pub next_upstream_timeout: Seconds,
}

impl Default for ProxyDefaults {
    /// ingress-nginx's defaults.
    fn default() -> Self {
        ProxyDefaults {
            buffer_size: Size::parse("4k").expect("valid default"),
            buffers_number: 4,
            busy_buffers_size: None,
            request_buffering: true,
            client_body_buffer_size: Size::parse("8k").expect("valid default"),
            cookie_domain: Rewrite::Off,
            cookie_path: Rewrite::Off,
            redirect: ProxyRedirect::Off,
            next_upstream_timeout: Seconds(0),
        }
    }
}

impl ProxyDefaults {
    /// Applies one ConfigMap key; `None` if the key is not one of these.
    pub fn apply(&mut self, key: &str, v: &str) -> Option<Result<(), Invalid>> {
        let r = (|| {
            match key {
                "proxy-buffer-size" => self.buffer_size = buffer_size(v, key)?,
                "proxy-buffers-number" => self.buffers_number = buffers_number(v)?,
                "proxy-busy-buffers-size" => self.busy_buffers_size = Some(buffer_size(v, key)?),
                "proxy-request-buffering" => self.request_buffering = on_off(v, key)?,
                "client-body-buffer-size" => self.client_body_buffer_size = body_buffer_size(v)?,
                "proxy-cookie-domain" => self.cookie_domain = Rewrite::cookie_domain(v)?,
                "proxy-cookie-path" => self.cookie_path = Rewrite::cookie_path(v)?,
                "proxy-redirect-from" => {
                    // The ConfigMap has no `-to`: only the two keywords mean anything.
                    self.redirect = match v.trim() {
                        "off" => ProxyRedirect::Off,
                        "default" => ProxyRedirect::Default,
                        _ => {
                            return Err(Invalid(format!(
                                "proxy-redirect-from in the ConfigMap must be off or default (a replacement needs the annotations): {v:?}"
                            )))
                        }
                    }
                }
                "proxy-next-upstream-timeout" => self.next_upstream_timeout = Seconds::parse(v)?,
                _ => return Ok(false),
            }
            Ok(true)
        })();
        match r {
            Ok(false) => None,
            Ok(true) => Some(Ok(())),
            Err(e) => Some(Err(e)),
        }
    }

    /// nginx's checks on the merged buffer keys; on a refusal they return
    /// to ingress-nginx's defaults.
    pub fn settle_buffers(&mut self) -> Result<(), Invalid> {
        let r = check_buffers(
            &self.buffer_size,
            self.buffers_number,
            self.busy_buffers_size.as_ref(),
            None,
        );
        if r.is_err() {
            let d = ProxyDefaults::default();
            self.buffer_size = d.buffer_size;
            self.buffers_number = d.buffers_number;
            self.busy_buffers_size = d.busy_buffers_size;
        }
        r
    }
}

/// `on`/`off`, as ingress-nginx takes `proxy-request-buffering` (and Go
/// booleans, which users also write).
pub fn on_off(v: &str, what: &str) -> Result<bool, Invalid> {
    match v.trim() {
        "on" | "true" => Ok(true),
        "off" | "false" => Ok(false),
        _ => Err(Invalid(format!("{what} must be on or off: {v:?}"))),
    }
}

/// An Ingress's overrides; `None` inherits the ConfigMap's value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize)]
pub struct ProxyOverrides {
    pub buffer_size: Option<Size>,
    pub buffers_number: Option<u32>,
    pub busy_buffers_size: Option<Size>,
    pub max_temp_file_size: Option<Size>,
    pub request_buffering: Option<bool>,
    pub client_body_buffer_size: Option<Size>,
    pub http_version: Option<HttpVersion>,
    pub cookie_domain: Option<Rewrite>,
    pub cookie_path: Option<Rewrite>,
    pub redirect: Option<ProxyRedirect>,
    pub next_upstream_timeout: Option<Seconds>,
}

impl ProxyOverrides {
    /// Whether any buffer setting is overridden (then the location renders
    /// `proxy_buffer_size` and `proxy_buffers` together, as ingress-nginx).
    pub fn buffers(&self) -> bool {
        self.buffer_size.is_some()
            || self.buffers_number.is_some()
            || self.busy_buffers_size.is_some()
            || self.max_temp_file_size.is_some()
    }

    /// The first buffer annotation this Ingress sets (what a refusal of
    /// the combination is reported against).
    pub fn first_buffer_annotation(&self) -> &'static str {
        if self.buffer_size.is_some() {
            "proxy-buffer-size"
        } else if self.buffers_number.is_some() {
            "proxy-buffers-number"
        } else if self.busy_buffers_size.is_some() {
            "proxy-busy-buffers-size"
        } else {
            "proxy-max-temp-file-size"
        }
    }

    /// Checks the merged buffer settings; on a refusal the buffer overrides
    /// are dropped (the ConfigMap's apply) and the reason is returned.
    pub fn settle_buffers(&mut self, g: &ProxyDefaults) -> Result<(), Invalid> {
        if !self.buffers() {
            return Ok(());
        }
        let size = self.buffer_size.get_or_insert_with(|| g.buffer_size.clone()).clone();
        let number = *self.buffers_number.get_or_insert(g.buffers_number);
        if self.busy_buffers_size.is_none() {
            self.busy_buffers_size = g.busy_buffers_size.clone();
        }
        let r = check_buffers(
            &size,
            number,
            self.busy_buffers_size.as_ref(),
            self.max_temp_file_size.as_ref(),
        );
        if r.is_err() {
            self.buffer_size = None;
            self.buffers_number = None;
            self.busy_buffers_size = None;
            self.max_temp_file_size = None;
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size(s: &str) -> Size {
        Size::parse(s).unwrap()
    }

    #[test]
    fn nginx_refusals_are_caught_before_nginx_sees_them() {
        // ingress-nginx's defaults and the usual OIDC fix pass.
        assert!(check_buffers(&size("4k"), 4, None, None).is_ok());
        assert!(check_buffers(&size("16k"), 4, None, None).is_ok());
        assert!(check_buffers(&size("128k"), 8, Some(&size("256k")), Some(&size("0"))).is_ok());
        // Two buffers with the default busy size (2 × size) fail nginx -t.
        let e = check_buffers(&size("8k"), 2, None, None).unwrap_err();
        assert!(e.0.contains("default of two buffers"), "{e}");
        assert!(check_buffers(&size("8k"), 4, Some(&size("4k")), None).is_err());
        assert!(check_buffers(&size("8k"), 4, Some(&size("32k")), None).is_err());
        assert!(check_buffers(&size("8k"), 4, None, Some(&size("4k"))).is_err());
        // The per-request memory bound.
        assert!(check_buffers(&size("1m"), 32, None, None).is_err());
    }

    #[test]
    fn sizes_are_bounded() {
        assert!(buffer_size("16k", "proxy-buffer-size").is_ok());
        assert!(buffer_size("2m", "proxy-buffer-size").is_err());
        assert!(buffer_size("100", "proxy-buffer-size").is_err());
        assert!(buffers_number("1").is_err() && buffers_number("100000").is_err());
        assert!(body_buffer_size("1g").is_err());
        assert!(max_temp_file_size("0").is_ok() && max_temp_file_size("100g").is_err());
    }

    #[test]
    fn rewrites_take_two_plain_tokens() {
        assert_eq!(Rewrite::cookie_domain("off").unwrap(), Rewrite::Off);
        assert_eq!(
            Rewrite::cookie_domain("localhost .example.org").unwrap(),
            Rewrite::Replace {
                from: "localhost".into(),
                to: ".example.org".into()
            }
        );
        for bad in ["a", "a b c", "a;b c", "$host example.org", "~.*\\.local example.org"] {
            assert!(Rewrite::cookie_domain(bad).is_err(), "{bad}");
        }
        assert!(Rewrite::cookie_path("/one/ /").is_ok());
        assert!(Rewrite::cookie_path("/one/ $uri").is_err());
    }

    #[test]
    fn proxy_redirect_follows_ingress_nginx() {
        assert_eq!(
            ProxyRedirect::parse("off", Some("/x")).unwrap(),
            Some(ProxyRedirect::Off)
        );
        assert_eq!(
            ProxyRedirect::parse("default", None).unwrap(),
            Some(ProxyRedirect::Default)
        );
        assert_eq!(ProxyRedirect::parse("http://backend:8080/", None).unwrap(), None);
        assert_eq!(
            ProxyRedirect::parse("http://backend:8080/", Some("/app/")).unwrap(),
            Some(ProxyRedirect::Replace {
                from: "http://backend:8080/".into(),
                to: "/app/".into()
            })
        );
        assert!(ProxyRedirect::parse("http://a/", Some("https://$host/")).is_err());
    }

    #[test]
    fn a_refused_combination_drops_only_the_buffer_overrides() {
        let g = ProxyDefaults::default();
        let mut o = ProxyOverrides {
            buffers_number: Some(2),
            request_buffering: Some(false),
            ..Default::default()
        };
        assert!(o.settle_buffers(&g).is_err());
        assert!(!o.buffers() && o.request_buffering == Some(false));
        let mut o = ProxyOverrides {
            buffer_size: Some(size("16k")),
            ..Default::default()
        };
        o.settle_buffers(&g).unwrap();
        assert_eq!((o.buffer_size.unwrap(), o.buffers_number), (size("16k"), Some(4)));
    }
}
