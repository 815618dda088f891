//! Every annotation and ConfigMap key of ingress-nginx (controller v1.15,
//! `docs/user-guide/nginx-configuration/annotations.md` and `configmap.md`,
//! plus the annotation names its parsers read but the tables omit), with
//! what this controller does with it.
//!
//! This table is the one place that says what is supported: the parsers'
//! "not supported" answers quote it, `ingress-controller check` sorts a
//! user's annotations by it, and the book's annotation and ConfigMap pages
//! are generated from it ([`crate::reference`]). A test parses every entry's sample value, so an entry
//! that says "supported" for a name the parser ignores (or the reverse)
//! fails the build.

/// What this controller does with one ingress-nginx name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Same name, same default, same meaning (values are validated more
    /// strictly).
    Supported,
    /// Honoured, with a difference the user should know about.
    Differs(&'static str),
    /// Reported and ignored, with the reason. An unsupported annotation
    /// that would grant or restrict access makes its Ingress fail closed.
    Unsupported(&'static str),
}

impl Status {
    pub fn honoured(self) -> bool {
        !matches!(self, Status::Unsupported(_))
    }

    pub fn label(self) -> &'static str {
        match self {
            Status::Supported => "supported",
            Status::Differs(_) => "differs",
            Status::Unsupported(_) => "unsupported",
        }
    }

    pub fn note(self) -> &'static str {
        match self {
            Status::Supported => "",
            Status::Differs(why) | Status::Unsupported(why) => why,
        }
    }
}

/// One ingress-nginx name with a value its parser accepts (for the test
/// that keeps this table and the parsers in step).
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    pub name: &'static str,
    pub sample: &'static str,
    pub status: Status,
}

const fn ok(name: &'static str, sample: &'static str) -> Entry {
    Entry {
        name,
        sample,
        status: Status::Supported,
    }
}

const fn differs(name: &'static str, sample: &'static str, why: &'static str) -> Entry {
    Entry {
        name,
        sample,
        status: Status::Differs(why),
    }
}

const fn no(name: &'static str, why: &'static str) -> Entry {
    Entry {
        name,
        sample: "x",
        status: Status::Unsupported(why),
    }
}

const SNIPPET: &str = "refused unless `--allow-snippet-annotations` (or the ConfigMap key); allowed, each is parsed as nginx would and refused if it leaves its block, loads code or names a file outside `--snippet-allowed-path` (see the Security model)";
const SSL_NAME: &str = "with `backend-protocol: HTTPS` or `GRPCS` (for gRPC too), and without `proxy-ssl-secret`; the name must be a literal host name, as upstream connections are kept alive per server name; `proxy-ssl-server-name: on` without a name sends none (ingress-nginx sends `upstream_balancer`)";
const OPERATOR_SNIPPET: &str = "operator snippets of the ConfigMap are not implemented yet";
const LOG_PATH: &str = "only `/dev/stdout`, `/dev/stderr`, `/dev/null` or a file under `/var/log`: nginx writes no other file a ConfigMap names";
const MODSECURITY: &str = "no ModSecurity in this nginx";
const OPERATION_NAME: &str = "may name the variables a log format may and ingress-nginx's per-location $service_name, $namespace, $ingress_name, $service_port and $location_path (filled in when rendered); any other variable is refused";
const OTEL_CONFIG: &str = "the module is configured by the otel-* and otlp-* keys; no TOML file is read";
const PROXY_SSL: &str = "backend TLS settings are not implemented yet; nginx's defaults apply";
const FASTCGI: &str = "FastCGI backends are not supported";
const STREAM: &str = "not implemented yet (tcp-services and udp-services are)";
const GEOIP: &str = "no GeoIP database or module in this nginx";
const JAEGER: &str = "Jaeger tracing was removed from ingress-nginx; no tracing module here";
const LUA: &str = "there is no Lua in this data plane";

/// ingress-nginx's annotations, without the `nginx.ingress.kubernetes.io/`
/// prefix, in name order.
pub static ANNOTATIONS: &[Entry] = &[
    ok("affinity", "cookie"),
    ok("affinity-canary-behavior", "legacy"),
    ok("affinity-mode", "persistent"),
    ok("allowlist-source-range", "10.0.0.0/8"),
    ok("app-root", "/app"),
    ok("auth-always-set-cookie", "true"),
    ok("auth-cache-duration", "200 202 401 5m"),
    differs("auth-cache-key", "$remote_user$http_authorization", "variables limited to request facts ($http_*, $cookie_*, $arg_*, $remote_user, $host, ...)"),
    differs("auth-keepalive", "10", "as ingress-nginx, only for a URL whose host is a name or an address (not `$host`); the name is resolved when nginx loads the configuration"),
    ok("auth-keepalive-requests", "500"),
    differs("auth-keepalive-share-vars", "true", "accepted; nginx's auth_request subrequest always shares the request's variables"),
    ok("auth-keepalive-timeout", "30"),
    ok("auth-method", "POST"),
    differs("auth-proxy-set-headers", "ingress-nginx/auth-headers", "a ConfigMap of the controller's own namespace; values may name only variables nginx knows"),
    ok("auth-realm", "Admins only"),
    ok("auth-request-redirect", "/signed-in"),
    ok("auth-response-headers", "X-Auth-Request-User, X-Auth-Request-Email"),
    differs(
        "auth-secret",
        "basic-auth",
        "a Secret of the Ingress's own namespace only",
    ),
    ok("auth-secret-type", "auth-map"),
    differs("auth-signin", "https://$host/oauth2/start?rd=$escaped_request_uri", "variables limited to request facts ($host, $escaped_request_uri, $request_uri, ...)"),
    ok("auth-signin-redirect-param", "return_to"),
    no("auth-snippet", "snippets are not rendered in the auth subrequest"),
    ok("auth-tls-error-page", "https://example.com/cert-help"),
    ok("auth-tls-match-cn", "CN=(client1|client2)"),
    ok("auth-tls-pass-certificate-to-upstream", "true"),
    differs("auth-tls-secret", "default/ca-secret", "a Secret of the Ingress's own namespace only; set by the host's first Ingress, another Ingress asking for other client certificates on that host fails closed; with verify-client on, requests without a verified certificate get 403 on plain HTTP too"),
    ok("auth-tls-verify-client", "optional"),
    ok("auth-tls-verify-depth", "2"),
    differs(
        "auth-type",
        "basic",
        "basic only: nginx has no digest authentication (digest fails closed)",
    ),
    differs("auth-url", "http://oauth2-proxy.auth.svc.cluster.local/oauth2/auth", "the host must not be this host's own address (as endpoints); `$host` in the host is the server's name, refused on the catch-all and wildcard servers; a name is resolved per request by `--resolver`/resolv.conf servers"),
    ok("backend-protocol", "GRPC"),
    differs(
        "canary",
        "true",
        "a canary attaches only to a primary Ingress of its own namespace",
    ),
    ok("canary-by-cookie", "canary"),
    ok("canary-by-header", "X-Canary"),
    ok("canary-by-header-pattern", "^yes$"),
    ok("canary-by-header-value", "yes"),
    ok("canary-weight", "10"),
    ok("canary-weight-total", "1000"),
    ok("client-body-buffer-size", "64k"),
    differs("configuration-snippet", "add_header X-Snippet 1;", SNIPPET),
    ok("connection-proxy-header", "keep-alive"),
    ok("cors-allow-credentials", "false"),
    ok("cors-allow-headers", "X-Custom, Content-Type"),
    ok("cors-allow-methods", "GET, POST"),
    ok("cors-allow-origin", "https://a.example, https://b.example"),
    ok("cors-expose-headers", "X-Custom"),
    ok("cors-max-age", "600"),
    differs("custom-headers", "ingress-nginx/app-headers", "a ConfigMap of the controller's own namespace (ingress-nginx reads any namespace); each header must be in global-allowed-response-headers, as in ingress-nginx"),
    ok("custom-http-errors", "404,503"),
    ok("default-backend", "fallback"),
    ok("denylist-source-range", "192.0.2.0/24"),
    ok("disable-proxy-intercept-errors", "true"),
    ok("enable-access-log", "false"),
    ok("enable-cors", "true"),
    ok("enable-global-auth", "false"),
    no("enable-modsecurity", MODSECURITY),
    ok("enable-opentelemetry", "true"),
    no("enable-owasp-core-rules", MODSECURITY),
    ok("enable-rewrite-log", "true"),
    no("fastcgi-index", FASTCGI),
    no("fastcgi-params-configmap", FASTCGI),
    ok("force-ssl-redirect", "true"),
    differs(
        "from-to-www-redirect",
        "true",
        "the trailing slash of the request URI is kept",
    ),
    no("http2-push-preload", "nginx 1.25.1 removed HTTP/2 server push"),
    ok("limit-allowlist", "10.0.0.0/8"),
    ok("limit-burst-multiplier", "3"),
    ok("limit-connections", "10"),
    ok("limit-rate", "100"),
    ok("limit-rate-after", "1024"),
    ok("limit-rpm", "300"),
    ok("limit-rps", "5"),
    ok("limit-whitelist", "10.0.0.0/8"),
    ok("load-balance", "ewma"),
    ok("mirror-host", "shadow.example.com"),
    ok("mirror-request-body", "off"),
    differs("mirror-target", "https://test.example.com$request_uri", "a URL with request variables only; its host obeys the endpoint policy, and a name is resolved per request (`--resolver`)"),
    no("modsecurity-snippet", MODSECURITY),
    no("modsecurity-transaction-id", MODSECURITY),
    differs("opentelemetry-operation-name", "HTTP $request_method $service_name $uri", OPERATION_NAME),
    ok("opentelemetry-trust-incoming-span", "false"),
    ok("permanent-redirect", "https://example.com/new"),
    ok("permanent-redirect-code", "308"),
    ok("preserve-trailing-slash", "true"),
    ok("proxy-body-size", "8m"),
    ok("proxy-buffer-size", "16k"),
    ok("proxy-buffering", "on"),
    ok("proxy-buffers-number", "8"),
    ok("proxy-busy-buffers-size", "32k"),
    ok("proxy-connect-timeout", "10"),
    ok("proxy-cookie-domain", "localhost example.org"),
    ok("proxy-cookie-path", "/app/ /"),
    ok("proxy-http-version", "1.0"),
    ok("proxy-max-temp-file-size", "0"),
    ok("proxy-next-upstream", "error timeout http_502"),
    ok("proxy-next-upstream-timeout", "10"),
    ok("proxy-next-upstream-tries", "2"),
    ok("proxy-read-timeout", "120"),
    ok("proxy-redirect-from", "http://backend:8080/"),
    ok("proxy-redirect-to", "/app/"),
    ok("proxy-request-buffering", "off"),
    ok("proxy-send-timeout", "120"),
    no("proxy-ssl-ciphers", PROXY_SSL),
    differs("proxy-ssl-name", "app.internal.example", SSL_NAME),
    no("proxy-ssl-protocols", PROXY_SSL),
    no("proxy-ssl-secret", PROXY_SSL),
    differs("proxy-ssl-server-name", "on", SSL_NAME),
    no("proxy-ssl-verify", PROXY_SSL),
    no("proxy-ssl-verify-depth", PROXY_SSL),
    ok("relative-redirects", "true"),
    ok("rewrite-target", "/$1"),
    ok("satisfy", "any"),
    ok("server-alias", "www.example.com"),
    differs("server-snippet", "add_header X-Snippet 1;", SNIPPET),
    ok("service-upstream", "true"),
    ok("session-cookie-change-on-failure", "true"),
    ok("session-cookie-conditional-samesite-none", "true"),
    ok("session-cookie-domain", "example.com"),
    ok("session-cookie-expires", "3600"),
    ok("session-cookie-max-age", "3600"),
    ok("session-cookie-name", "route"),
    ok("session-cookie-path", "/app"),
    ok("session-cookie-samesite", "Lax"),
    ok("session-cookie-secure", "true"),
    no("ssl-ciphers", "not implemented yet; the ConfigMap's ssl-ciphers apply"),
    ok("ssl-passthrough", "true"),
    no(
        "ssl-prefer-server-ciphers",
        "not implemented yet; the ConfigMap's setting applies",
    ),
    ok("ssl-redirect", "false"),
    no("stream-snippet", STREAM),
    ok("temporal-redirect", "https://example.com/tmp"),
    ok("temporal-redirect-code", "307"),
    ok("upstream-hash-by", "$request_uri"),
    ok("upstream-hash-by-subset", "true"),
    ok("upstream-hash-by-subset-size", "3"),
    ok("upstream-vhost", "internal.example"),
    ok("use-port-in-redirects", "true"),
    ok("use-regex", "true"),
    ok("whitelist-source-range", "10.0.0.0/8"),
    ok("x-forwarded-prefix", "/app"),
];

/// ingress-nginx's ConfigMap keys, in name order.
pub static CONFIG_MAP: &[Entry] = &[
    no("access-log-params", "not implemented yet"),
    differs("access-log-path", "/dev/stdout", LOG_PATH),
    differs("add-headers", "ingress-nginx/custom-headers", "a ConfigMap of the controller's own namespace; values may name only variables nginx knows; added with add_header always (repeated where a location adds headers of its own) rather than headers-more"),
    ok("allow-backend-server-header", "true"),
    no(
        "allow-cross-namespace-resources",
        "resources are never read across namespaces",
    ),
    differs("allow-snippet-annotations", "true", SNIPPET),
    no(
        "annotation-value-word-blocklist",
        "every value is parsed into a typed value instead; no word list is needed",
    ),
    no(
        "annotations-risk-level",
        "no risk levels: snippets are off unless allowed, every other value is typed",
    ),
    no("bind-address", "not implemented yet; `--listen-address` sets it"),
    ok("block-cidrs", "192.0.2.0/24"),
    ok("block-referers", "~*spam"),
    ok("block-user-agents", "~*bot,curl/7.0"),
    no("brotli-level", "no brotli module in this nginx"),
    no("brotli-min-length", "no brotli module in this nginx"),
    no("brotli-types", "no brotli module in this nginx"),
    ok("client-body-buffer-size", "64k"),
    ok("client-body-timeout", "30"),
    ok("client-header-buffer-size", "2k"),
    ok("client-header-timeout", "30"),
    ok("compute-full-forwarded-for", "true"),
    ok("custom-http-errors", "404,503"),
    no("debug-connections", "not implemented yet"),
    no("default-type", "not implemented yet"),
    no("denylist-source-range", "not implemented yet"),
    differs("disable-access-log", "true", "`enable-access-log` is accepted too"),
    no("disable-ipv6", "not implemented yet"),
    no("disable-ipv6-dns", "not implemented yet"),
    ok("enable-access-log-for-default-backend", "true"),
    no("enable-aio-write", "not implemented yet"),
    no("enable-brotli", "no brotli module in this nginx"),
    no("enable-modsecurity", MODSECURITY),
    ok("enable-multi-accept", "false"),
    no("enable-ocsp", "not implemented yet"),
    ok("enable-opentelemetry", "true"),
    no("enable-owasp-modsecurity-crs", MODSECURITY),
    ok("enable-real-ip", "true"),
    no("enable-serial-reloads", "reloads are always serial here"),
    no("enable-syslog", "not implemented yet"),
    ok("enable-underscores-in-headers", "true"),
    ok("error-log-level", "warn"),
    differs("error-log-path", "/dev/stderr", LOG_PATH),
    no("force-ssl-redirect", "not implemented yet"),
    ok("forwarded-for-header", "X-Real-Client"),
    no("forwarded-for-proxy-protocol-header", "not implemented yet"),
    ok("generate-request-id", "false"),
    no("geoip2-autoreload-in-minutes", GEOIP),
    ok("global-allowed-response-headers", "X-Frame-Options,X-Team"),
    ok("global-auth-cache-duration", "200 202 401 5m"),
    ok("global-auth-cache-key", "$http_authorization"),
    ok("global-auth-method", "GET"),
    ok("global-auth-request-redirect", "/signed-in"),
    ok("global-auth-response-headers", "X-Auth-Request-User"),
    ok("global-auth-signin", "https://login.example.com/oauth2/start"),
    ok("global-auth-signin-redirect-param", "rd"),
    no("global-auth-snippet", "snippets are not rendered in the global auth subrequest"),
    differs("global-auth-url", "http://oauth2-proxy.auth.svc.cluster.local/oauth2/auth", "an invalid URL makes the locations it would protect fail closed (503) instead of unprotected; `$host` is each server's name"),
    no("grpc-buffer-size-kb", "not implemented yet"),
    ok("gzip-disable", "msie6"),
    ok("gzip-level", "5"),
    ok("gzip-min-length", "1024"),
    ok("gzip-types", "text/html application/json"),
    ok("hide-headers", "X-Powered-By"),
    ok("hsts", "false"),
    ok("hsts-include-subdomains", "false"),
    ok("hsts-max-age", "600"),
    ok("hsts-preload", "true"),
    differs("http-access-log-path", "/var/log/nginx/access.log", LOG_PATH),
    ok("http-redirect-code", "301"),
    no("http-snippet", OPERATOR_SNIPPET),
    ok("http2-max-concurrent-streams", "64"),
    no(
        "http2-max-field-size",
        "removed from nginx (1.19.7); large-client-header-buffers applies",
    ),
    no(
        "http2-max-header-size",
        "removed from nginx (1.19.7); large-client-header-buffers applies",
    ),
    no(
        "http2-max-requests",
        "removed from nginx (1.19.7); keep-alive-requests applies",
    ),
    ok("ignore-invalid-headers", "false"),
    no("jaeger-baggage-header", JAEGER),
    no("jaeger-collector-host", JAEGER),
    no("jaeger-collector-port", JAEGER),
    no("jaeger-debug-header", JAEGER),
    no("jaeger-endpoint", JAEGER),
    no("jaeger-propagation-format", JAEGER),
    no("jaeger-sampler-host", JAEGER),
    no("jaeger-sampler-param", JAEGER),
    no("jaeger-sampler-port", JAEGER),
    no("jaeger-sampler-type", JAEGER),
    no("jaeger-service-name", JAEGER),
    no("jaeger-trace-baggage-header-prefix", JAEGER),
    no("jaeger-trace-context-header-name", JAEGER),
    ok("keep-alive", "30"),
    ok("keep-alive-requests", "500"),
    ok("large-client-header-buffers", "4 16k"),
    ok("limit-conn-status-code", "429"),
    no("limit-conn-zone-variable", "not implemented yet"),
    ok("limit-rate", "100"),
    ok("limit-rate-after", "1024"),
    ok("limit-req-status-code", "429"),
    ok("load-balance", "ewma"),
    no("location-snippet", OPERATOR_SNIPPET),
    ok("log-format-escape-json", "true"),
    ok("log-format-escape-none", "true"),
    no("log-format-stream", STREAM),
    differs("log-format-upstream", "$remote_addr [$time_local] \"$request\" $status $req_id", "known variables only; $proxy_upstream_name, $proxy_alternative_upstream_name and $req_id are provided, ingress-nginx's $namespace, $ingress_name, $service_name and $service_port are not"),
    no("lua-shared-dicts", LUA),
    no("main-snippet", OPERATOR_SNIPPET),
    ok("map-hash-bucket-size", "128"),
    ok("max-worker-connections", "4096"),
    no("max-worker-open-files", "not implemented yet"),
    no("modsecurity-snippet", MODSECURITY),
    no(
        "nginx-status-ipv4-whitelist",
        "there is no /nginx_status page; `/metrics` has the counters",
    ),
    no(
        "nginx-status-ipv6-whitelist",
        "there is no /nginx_status page; `/metrics` has the counters",
    ),
    ok("no-auth-locations", "/.well-known/acme-challenge,/healthz"),
    ok("no-tls-redirect-locations", "/.well-known/acme-challenge,/health"),
    no("opentelemetry-config", OTEL_CONFIG),
    differs("opentelemetry-operation-name", "HTTP $request_method $service_name $uri", OPERATION_NAME),
    ok("opentelemetry-trust-incoming-span", "false"),
    ok("otel-max-export-batch-size", "256"),
    ok("otel-max-queuesize", "4096"),
    ok("otel-sampler", "TraceIdRatioBased"),
    ok("otel-sampler-parent-based", "true"),
    ok("otel-sampler-ratio", "0.1"),
    ok("otel-schedule-delay-millis", "1000"),
    ok("otel-service-name", "edge-proxy"),
    ok("otlp-collector-host", "otel-collector.monitoring.svc"),
    ok("otlp-collector-port", "4317"),
    no("proxy-add-original-uri-header", "not implemented yet"),
    ok("proxy-body-size", "8m"),
    ok("proxy-buffer-size", "16k"),
    ok("proxy-buffering", "on"),
    ok("proxy-buffers-number", "8"),
    ok("proxy-busy-buffers-size", "32k"),
    ok("proxy-connect-timeout", "10"),
    ok("proxy-cookie-domain", "localhost example.org"),
    ok("proxy-cookie-path", "/app/ /"),
    ok("proxy-headers-hash-bucket-size", "128"),
    ok("proxy-headers-hash-max-size", "1024"),
    ok("proxy-next-upstream", "error timeout http_502"),
    ok("proxy-next-upstream-timeout", "10"),
    ok("proxy-next-upstream-tries", "2"),
    no("proxy-protocol-header-timeout", "not implemented yet"),
    ok("proxy-read-timeout", "120"),
    ok("proxy-real-ip-cidr", "10.0.0.0/8,192.168.0.1"),
    differs(
        "proxy-redirect-from",
        "default",
        "off or default only; a replacement needs the annotations",
    ),
    ok("proxy-request-buffering", "off"),
    ok("proxy-send-timeout", "120"),
    differs("proxy-set-headers", "ingress-nginx/proxy-headers", "a ConfigMap of the controller's own namespace; values may name only variables nginx knows"),
    no("proxy-ssl-location-only", PROXY_SSL),
    ok("proxy-stream-next-upstream", "false"),
    ok("proxy-stream-next-upstream-timeout", "30"),
    ok("proxy-stream-next-upstream-tries", "2"),
    ok("proxy-stream-responses", "2"),
    ok("proxy-stream-timeout", "30s"),
    ok("relative-redirects", "true"),
    no("retry-non-idempotent", "not implemented yet"),
    no("reuse-port", "not implemented yet"),
    differs(
        "server-name-hash-bucket-size",
        "128",
        "a lower bound: the controller sizes the hash from the host names",
    ),
    differs(
        "server-name-hash-max-size",
        "2048",
        "a lower bound: the controller sizes the hash from the host names",
    ),
    no("server-snippet", OPERATOR_SNIPPET),
    ok("server-tokens", "true"),
    no("service-upstream", "not implemented yet; the annotation works"),
    ok("skip-access-log-urls", "/health,/ready"),
    no("ssl-buffer-size", "not implemented yet"),
    ok(
        "ssl-ciphers",
        "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256",
    ),
    no("ssl-dh-param", "not implemented yet"),
    ok("ssl-ecdh-curve", "X25519:prime256v1"),
    ok("ssl-protocols", "TLSv1.2 TLSv1.3"),
    ok("ssl-redirect", "false"),
    no(
        "ssl-reject-handshake",
        "every host answers TLS with the default certificate, as ingress-nginx's default does",
    ),
    ok("ssl-session-cache", "false"),
    ok("ssl-session-cache-size", "20m"),
    no("ssl-session-ticket-key", "not implemented yet"),
    ok("ssl-session-tickets", "true"),
    ok("ssl-session-timeout", "1h"),
    no("stream-access-log-path", STREAM),
    no("stream-snippet", STREAM),
    no(
        "strict-validate-path-type",
        "paths are always validated strictly: a Prefix or Exact path is a plain URL path",
    ),
    no("syslog-host", "not implemented yet"),
    no("syslog-port", "not implemented yet"),
    ok("upstream-keepalive-connections", "64"),
    ok("upstream-keepalive-requests", "1000"),
    ok("upstream-keepalive-time", "30m"),
    ok("upstream-keepalive-timeout", "30"),
    ok("use-forwarded-headers", "true"),
    no("use-geoip", GEOIP),
    no("use-geoip2", GEOIP),
    ok("use-gzip", "true"),
    ok("use-http2", "false"),
    ok("use-proxy-protocol", "true"),
    ok("variables-hash-bucket-size", "512"),
    ok("variables-hash-max-size", "4096"),
    no("whitelist-source-range", "not implemented yet"),
    no("worker-cpu-affinity", "not implemented yet"),
    ok("worker-processes", "2"),
    ok("worker-shutdown-timeout", "60s"),
];

/// Keys this controller reads that ingress-nginx does not have.
pub static CONFIG_MAP_EXTRA: &[Entry] = &[
    differs("enable-access-log", "false", "the opposite of `disable-access-log`"),
    differs(
        "ssl-early-data",
        "true",
        "ingress-nginx has it in the template but not in its documented keys",
    ),
    differs(
        "ssl-prefer-server-ciphers",
        "false",
        "ingress-nginx has it in the template but not in its documented keys",
    ),
    differs("use-http3", "true", "HTTP/3 over QUIC; ingress-nginx has none"),
];

pub fn annotation(name: &str) -> Option<&'static Entry> {
    ANNOTATIONS.iter().find(|e| e.name == name)
}

pub fn config_map_key(name: &str) -> Option<&'static Entry> {
    CONFIG_MAP.iter().chain(CONFIG_MAP_EXTRA).find(|e| e.name == name)
}

/// Whether an annotation asks for access control (authentication, client
/// certificates, `satisfy`, a WAF). Ignoring one would serve what it
/// protects to everyone, so an unimplemented one fails closed instead of
/// being ignored like other unknown annotations.
pub fn is_access_control(name: &str) -> bool {
    (name.starts_with("auth-") || name.starts_with("modsecurity-") || name.starts_with("global-auth"))
        || matches!(
            name,
            "satisfy" | "enable-modsecurity" | "enable-owasp-core-rules" | "enable-owasp-modsecurity-crs"
        )
}

/// Why an ingress-nginx name is ignored, or a generic answer for a name
/// ingress-nginx does not have either.
pub fn unsupported_reason(entry: Option<&Entry>) -> String {
    match entry.map(|e| e.status) {
        Some(Status::Unsupported(why)) => format!("not supported ({why}); ignored"),
        Some(_) => "ignored".into(),
        None => "not an ingress-nginx name; ignored".into(),
    }
}

/// `(honoured, total)`.
pub fn counts(entries: &[Entry]) -> (usize, usize) {
    (entries.iter().filter(|e| e.status.honoured()).count(), entries.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_sorted_and_unique() {
        for list in [ANNOTATIONS, CONFIG_MAP, CONFIG_MAP_EXTRA] {
            for w in list.windows(2) {
                assert!(w[0].name < w[1].name, "{} then {}", w[0].name, w[1].name);
            }
        }
        for e in CONFIG_MAP_EXTRA {
            assert!(CONFIG_MAP.iter().all(|c| c.name != e.name), "{}", e.name);
        }
    }
}
