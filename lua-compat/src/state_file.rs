//! The state file's format: the zone's backends written to disk after each
//! write, so that a restarted nginx routes before any controller pushes.
//!
//! ```json
//! {"version":1,"generation":12,"backends":[{"name":"web",...},...]}
//! ```
//!
//! `backends` holds each backend's canonical JSON exactly as
//! `GET /configuration/backends` returns it; `generation` is the zone's
//! generation when the file was written (informational: a restarted zone
//! counts from zero again). Certificates and the servers map are never
//! written: their private keys must not reach the disk through the module.
//!
//! Reading applies the validation of a `POST /configuration/backends`
//! ([`crate::runtime::prepare_backends`]), so a hand-edited file cannot
//! bring in what the API would refuse, and a file refused anywhere is
//! refused whole.

use std::fmt;
use std::path::Path;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::runtime::{prepare_backends, Prepared, Resolver};
use crate::validate::ValidationError;

/// The format this code writes and the only one it reads.
pub const VERSION: u64 = 1;

/// The file's bytes for `generation` and the backends' canonical JSON
/// objects (sorted by name, as the zone keeps them).
pub fn render<'a>(generation: u64, backends: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = format!("{{\"version\":{VERSION},\"generation\":{generation},\"backends\":[").into_bytes();
    for (i, json) in backends.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(json);
    }
    out.extend_from_slice(b"]}\n");
    out
}

/// A state file read back and validated, ready for the zone.
#[derive(Debug)]
pub struct Restored {
    /// The generation the file was written at.
    pub generation: u64,
    pub backends: Vec<Prepared>,
}

/// Why a state file was not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateFileError {
    /// Not one whole JSON object: truncated, corrupt or not JSON at all.
    Syntax(String),
    /// Written by another format version.
    Version(u64),
    /// A required member is absent.
    Missing(&'static str),
    /// The backends would be refused by a POST.
    Invalid(ValidationError),
}

impl fmt::Display for StateFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StateFileError::Syntax(e) => write!(f, "not a complete state file: {e}"),
            StateFileError::Version(v) => write!(f, "format version {v}, only version {VERSION} is read"),
            StateFileError::Missing(what) => write!(f, "no \"{what}\" member"),
            StateFileError::Invalid(e) if e.path.is_empty() => write!(f, "refused: {}", e.message),
            StateFileError::Invalid(e) => write!(f, "refused at {}: {}", e.path, e.message),
        }
    }
}

impl std::error::Error for StateFileError {}

/// Checks, when the configuration is loaded, that `path` can hold the
/// state file: it names a file (not a directory) in an existing directory.
pub fn check_location(path: &Path) -> Result<(), String> {
    if path.file_name().is_none() {
        return Err(format!("\"{}\" does not name a file", path.display()));
    }
    if path.is_dir() {
        return Err(format!("\"{}\" is a directory", path.display()));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(format!("\"{}\" is not a directory", dir.display())),
        Err(e) => Err(format!("the directory \"{}\" cannot be used: {e}", dir.display())),
    }
}

/// Every member optional, so that the version is checked before anything
/// a later format may have renamed.
#[derive(Deserialize)]
struct Envelope<'a> {
    version: Option<u64>,
    generation: Option<u64>,
    #[serde(borrow)]
    backends: Option<&'a RawValue>,
}

/// Parses and validates a state file. DNS names (`ExternalName`
/// backends) go through `resolve`, as in a write.
pub fn parse(bytes: &[u8], resolve: Resolver<'_>) -> Result<Restored, StateFileError> {
    let envelope: Envelope = serde_json::from_slice(bytes).map_err(|e| StateFileError::Syntax(e.to_string()))?;
    match envelope.version {
        Some(VERSION) => {}
        Some(other) => return Err(StateFileError::Version(other)),
        None => return Err(StateFileError::Missing("version")),
    }
    let generation = envelope.generation.ok_or(StateFileError::Missing("generation"))?;
    let backends = envelope.backends.ok_or(StateFileError::Missing("backends"))?;
    let backends = prepare_backends(backends.get().as_bytes(), resolve).map_err(|e| {
        StateFileError::Invalid(ValidationError {
            path: format!("backends{}", e.path),
            message: e.message,
        })
    })?;
    Ok(Restored { generation, backends })
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use proptest::prelude::*;

    use super::*;

    fn no_dns(_: &str, _: u16) -> Vec<IpAddr> {
        Vec::new()
    }

    fn backend(name: &str, port: u16) -> Vec<u8> {
        let body = format!(r#"[{{"name":"{name}","endpoints":[{{"address":"10.0.0.1","port":"{port}"}}]}}]"#);
        prepare_backends(body.as_bytes(), &mut no_dns).unwrap().remove(0).json
    }

    fn sample() -> (Vec<Vec<u8>>, Vec<u8>) {
        let jsons = vec![backend("a", 80), backend("b", 8080), backend("c", 443)];
        let file = render(7, jsons.iter().map(Vec::as_slice));
        (jsons, file)
    }

    #[test]
    fn round_trips_the_canonical_json() {
        let (jsons, file) = sample();
        assert!(file.starts_with(br#"{"version":1,"generation":7,"backends":[{"#));
        let restored = parse(&file, &mut no_dns).unwrap();
        assert_eq!(restored.generation, 7);
        let again: Vec<Vec<u8>> = restored.backends.into_iter().map(|p| p.json).collect();
        assert_eq!(again, jsons, "restored blobs are byte for byte the saved ones");
    }

    #[test]
    fn an_empty_set_round_trips() {
        let file = render(0, std::iter::empty());
        assert_eq!(file, b"{\"version\":1,\"generation\":0,\"backends\":[]}\n");
        assert!(parse(&file, &mut no_dns).unwrap().backends.is_empty());
    }

    #[test]
    fn every_truncation_is_refused() {
        let (_, file) = sample();
        // The last byte is the newline: without it the object is whole.
        for len in 0..file.len() - 1 {
            let e = parse(&file[..len], &mut no_dns).unwrap_err();
            assert!(matches!(e, StateFileError::Syntax(_)), "{len}: {e}");
        }
    }

    #[test]
    fn two_files_run_together_are_refused() {
        let (_, file) = sample();
        let twice = [file.as_slice(), file.as_slice()].concat();
        assert!(matches!(parse(&twice, &mut no_dns), Err(StateFileError::Syntax(_))));
    }

    #[test]
    fn corrupt_bytes_are_refused() {
        for junk in [
            &b""[..],
            b"\0\0\0\0",
            b"\xff\xfe{",
            b"[]",
            b"null",
            b"{\"version\":\"1\"}",
        ] {
            assert!(
                matches!(parse(junk, &mut no_dns), Err(StateFileError::Syntax(_))),
                "{junk:?}"
            );
        }
    }

    #[test]
    fn another_version_is_refused_before_its_members_are_read() {
        let e = parse(br#"{"version":2,"state":{}}"#, &mut no_dns).unwrap_err();
        assert_eq!(e, StateFileError::Version(2));
        assert_eq!(e.to_string(), "format version 2, only version 1 is read");
        assert_eq!(
            parse(br#"{"generation":1,"backends":[]}"#, &mut no_dns).unwrap_err(),
            StateFileError::Missing("version")
        );
        assert_eq!(
            parse(br#"{"version":1,"backends":[]}"#, &mut no_dns).unwrap_err(),
            StateFileError::Missing("generation")
        );
        assert_eq!(
            parse(br#"{"version":1,"generation":3}"#, &mut no_dns).unwrap_err(),
            StateFileError::Missing("backends")
        );
    }

    #[test]
    fn what_a_post_refuses_is_refused() {
        let not_an_ip = br#"{"version":1,"generation":1,"backends":[
            {"name":"ok","endpoints":[{"address":"10.0.0.1","port":"80"}]},
            {"name":"bad","endpoints":[{"address":"10.0.0.2; rm","port":"80"}]}]}"#;
        let e = parse(not_an_ip, &mut no_dns).unwrap_err();
        let StateFileError::Invalid(v) = &e else { panic!("{e}") };
        assert_eq!(v.path, "backends[1].endpoints[0].address");
        assert!(
            e.to_string()
                .starts_with("refused at backends[1].endpoints[0].address: "),
            "{e}"
        );

        let bad_port = br#"{"version":1,"generation":1,"backends":[{"name":"a","endpoints":[{"address":"10.0.0.1","port":"0"}]}]}"#;
        let StateFileError::Invalid(v) = parse(bad_port, &mut no_dns).unwrap_err() else {
            panic!("port 0 must be refused")
        };
        assert_eq!(v.path, "backends[0].endpoints[0].port");

        let duplicate = br#"{"version":1,"generation":1,"backends":[{"name":"a"},{"name":"a"}]}"#;
        let StateFileError::Invalid(v) = parse(duplicate, &mut no_dns).unwrap_err() else {
            panic!("duplicates must be refused")
        };
        assert_eq!(v.path, "backends[1].name");

        let not_a_list = br#"{"version":1,"generation":1,"backends":{"name":"a"}}"#;
        assert!(matches!(
            parse(not_a_list, &mut no_dns),
            Err(StateFileError::Invalid(_))
        ));
    }

    #[test]
    fn the_location_must_be_a_file_in_a_directory() {
        let dir = std::env::temp_dir();
        assert_eq!(check_location(&dir.join("dynbal-test.state")), Ok(()));
        let e = check_location(&dir).unwrap_err();
        assert!(e.ends_with("is a directory"), "{e}");
        let e = check_location(&dir.join("dynbal-absent-dir/x.state")).unwrap_err();
        assert!(e.contains("cannot be used: No such file or directory"), "{e}");
        let e = check_location(Path::new("/")).unwrap_err();
        assert!(e.contains("does not name a file"), "{e}");
    }

    #[test]
    fn dns_names_go_through_the_resolver() {
        let file = br#"{"version":1,"generation":4,"backends":[{"name":"ext",
            "service":{"spec":{"type":"ExternalName"}},"endpoints":[{"address":"db.example","port":"5432"}]}]}"#;
        let restored = parse(file, &mut no_dns).unwrap();
        assert_eq!(
            (restored.backends[0].endpoints, restored.backends[0].resolves),
            (0, true)
        );
        let mut table = |_: &str, _: u16| vec!["192.0.2.1".parse().unwrap()];
        assert_eq!(parse(file, &mut table).unwrap().backends[0].endpoints, 1);
    }

    proptest! {
        /// A file with any byte changed is refused or, if still valid
        /// JSON, read as some whole set of backends: never a panic.
        #[test]
        fn a_changed_byte_never_panics(at in 0usize..400, byte in any::<u8>()) {
            let (_, mut file) = sample();
            let at = at % file.len();
            file[at] = byte;
            let _ = parse(&file, &mut no_dns);
        }

        /// Whatever is cut off the end, a shorter file is refused.
        #[test]
        fn a_cut_file_is_refused(n in 1usize..20, cut in 1usize..2000) {
            let jsons: Vec<Vec<u8>> = (0..n).map(|i| backend(&format!("b{i:02}"), 80 + i as u16)).collect();
            let file = render(n as u64, jsons.iter().map(Vec::as_slice));
            // At most len - 2 bytes: the object without its last brace.
            let keep = cut % (file.len() - 1);
            prop_assert!(parse(&file[..keep], &mut no_dns).is_err());
        }
    }
}
