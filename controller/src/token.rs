//! The bearer token of the module's API.
//!
//! The API listens on loopback, but that alone does not protect it: anything
//! on the node, or a request nginx itself proxies there, could reach it. So
//! the controller generates a random token at start, writes it to a file
//! only its user can read, renders `dynamic_balancer_api_token_file` into
//! nginx.conf and sends the token with every API call. The token never
//! appears in logs, in nginx.conf or in any answer.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use anyhow::Context as _;

/// A new random token (256 bits, hex), written to `path` (mode 0600).
pub fn generate(path: &Path) -> anyhow::Result<String> {
    let mut bytes = [0u8; 32];
    openssl::rand::rand_bytes(&mut bytes).context("generating the API token")?;
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    write_private(path, format!("{token}\n").as_bytes())?;
    Ok(token)
}

/// The token in `path` (its first line), as the module reads it.
pub fn read(path: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let token = text.lines().next().unwrap_or("").trim_end_matches('\r').to_string();
    lua_compat::api::check_token(token.as_bytes()).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(token)
}

/// Writes a file only its owner can read, without following a symlink
/// someone planted at its path: the data goes to a fresh temporary file
/// (`O_CREAT|O_EXCL|O_NOFOLLOW`, mode 0600) that is then renamed into place.
pub fn write_private(path: &Path, data: &[u8]) -> anyhow::Result<()> {
    let dir = path.parent().context("a file path has a directory")?;
    let name = path.file_name().context("a file path has a name")?.to_string_lossy();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(data)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("moving {} into place", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn tokens_are_random_private_and_read_back() {
        let dir = std::env::temp_dir().join(format!("token-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("api-token");
        let a = generate(&path).unwrap();
        assert_eq!(a.len(), 64);
        assert_eq!(read(&path).unwrap(), a);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_ne!(generate(&path).unwrap(), a);
        std::fs::write(&path, "short\n").unwrap();
        assert!(read(&path).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
