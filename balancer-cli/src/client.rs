//! The API as the commands see it: a method and a path in, a 2xx response
//! or a [`Failure`] out.

use std::time::Duration;

use crate::failure::Failure;
use crate::http::{Request, Response};
use crate::transport::{exchange, Target};

pub struct Client {
    pub target: Target,
    /// Checked header-safe when it was read (see `main.rs`).
    pub token: Option<String>,
    pub timeout: Duration,
}

impl Client {
    /// One request; any status outside 2xx is a [`Failure::Api`].
    pub fn call(&self, method: &str, path: &str, body: Option<&[u8]>) -> Result<Response, Failure> {
        let host = self.target.host_header();
        let request = Request {
            method,
            path,
            host: &host,
            token: self.token.as_deref(),
            body,
        }
        .encode();
        let response = exchange(&self.target, &request, self.timeout).map_err(|error| Failure::Transport {
            method: method.into(),
            path: path.into(),
            error,
        })?;
        if (200..300).contains(&response.status) {
            Ok(response)
        } else {
            Err(Failure::Api {
                method: method.into(),
                path: path.into(),
                status: response.status,
                reason: response.reason,
                body: response.body,
            })
        }
    }
}

/// `/configuration/backends/{name}`, the name percent-encoded: nginx
/// decodes the path before the module routes it, so a name with spaces,
/// `%`, `?` or `#` reaches the API as written. Only RFC 3986's unreserved
/// characters go through as they are.
pub fn backend_path(name: &str) -> String {
    let mut path = String::from("/configuration/backends/");
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            path.push(b as char);
        } else {
            path.push_str(&format!("%{b:02X}"));
        }
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_percent_encoded() {
        assert_eq!(backend_path("default-web-80"), "/configuration/backends/default-web-80");
        assert_eq!(backend_path("a b?c#d%e"), "/configuration/backends/a%20b%3Fc%23d%25e");
        assert_eq!(backend_path("ü/x"), "/configuration/backends/%C3%BC%2Fx");
    }
}
