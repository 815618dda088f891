//! nginx with this project's patches to nginx itself
//! (`nginx-build/patches/*.patch`).
//!
//! The module is compiled against the nginx that nginx-sys's `vendored`
//! feature configures and builds; every `cargo` invocation of the workspace
//! makes that one, so `cargo test` and the module never disagree about
//! nginx's structures. The binary we ship is built again from a patched copy
//! of the same source with the same `configure` arguments (read back from
//! `nginx -V`), so the module's signature matches and only the patched
//! function bodies differ. A patch must therefore never change a structure,
//! a directive or a configure option; each file says what it changes and why.
//!
//! The copy, configure and make run once; the stamp (source, arguments and
//! patch texts) makes later builds a no-op.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// Builds `<out>/objs/nginx` from the source `vendored` was built from, with
/// the patches applied, and returns its path. Without patches it returns
/// `vendored` itself.
pub fn build(vendored: &Path, patches_dir: &Path, out: &Path) -> Result<PathBuf, String> {
    let patches = patch_files(patches_dir)?;
    if patches.is_empty() {
        return Ok(vendored.to_path_buf());
    }
    let objs = vendored.parent().ok_or("the nginx binary has no directory")?;
    let source = source_root(objs).ok_or_else(|| format!("no nginx source named in {}/Makefile", objs.display()))?;
    let args = configure_arguments(vendored)?;
    let mut stamp = format!("{}\n{}\n", source.display(), args.join(" "));
    for p in &patches {
        stamp.push_str(&fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?);
    }
    let binary = out.join("objs/nginx");
    let stamp_file = out.join("stamp");
    if binary.is_file() && fs::read_to_string(&stamp_file).is_ok_and(|s| s == stamp) {
        return Ok(binary);
    }

    let started = Instant::now();
    eprintln!(
        "nginx-build: building nginx with {} patch(es) from {}",
        patches.len(),
        patches_dir.display()
    );
    if out.exists() {
        fs::remove_dir_all(out).map_err(|e| format!("rm {}: {e}", out.display()))?;
    }
    fs::create_dir_all(out).map_err(|e| format!("mkdir {}: {e}", out.display()))?;
    let src = out.join("src");
    run(Command::new("cp").arg("-r").arg(&source).arg(&src))?;
    for p in &patches {
        run(Command::new("patch")
            .args(["-p1", "--batch", "--forward", "--quiet", "-d"])
            .arg(&src)
            .arg("-i")
            .arg(p))
        .map_err(|e| format!("{} does not apply to {}: {e}", p.display(), source.display()))?;
    }
    let configure = ["configure", "auto/configure"]
        .iter()
        .map(|c| src.join(c))
        .find(|c| c.is_file())
        .ok_or_else(|| format!("no configure script in {}", src.display()))?;
    let mut builddir = std::ffi::OsString::from("--builddir=");
    builddir.push(out.join("objs"));
    run(Command::new(configure).args(&args).arg(builddir).current_dir(&src))?;
    let jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
    run(Command::new("make")
        .arg(format!("-j{jobs}"))
        .arg("build")
        .current_dir(&src))?;
    fs::write(&stamp_file, stamp).map_err(|e| format!("{}: {e}", stamp_file.display()))?;
    eprintln!(
        "nginx-build: patched nginx built in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(binary)
}

/// The `.patch` files of `dir`, in name order (the order they apply in).
fn patch_files(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut patches: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "patch"))
        .collect();
    patches.sort();
    Ok(patches)
}

/// The nginx source tree a vendored build used: nginx-src records it, with
/// the configure flags, in `objs/last-build-info` as `"<dir>"|<flags>`.
pub fn source_root(objs: &Path) -> Option<PathBuf> {
    let info = fs::read_to_string(objs.join("last-build-info")).ok()?;
    let (quoted, _flags) = info.split_once('|')?;
    let dir = quoted.strip_prefix('"')?.strip_suffix('"')?;
    (!dir.contains('\\')).then(|| PathBuf::from(dir))
}

/// The `configure` arguments `nginx -V` reports, without `--builddir`.
fn configure_arguments(nginx: &Path) -> Result<Vec<String>, String> {
    let out = Command::new(nginx)
        .arg("-V")
        .output()
        .map_err(|e| format!("cannot run {}: {e}", nginx.display()))?;
    let text = String::from_utf8_lossy(&out.stderr);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("configure arguments:"))
        .ok_or_else(|| format!("{} -V names no configure arguments", nginx.display()))?;
    Ok(split_arguments(line))
}

/// Splits `nginx -V`'s argument line at each option (` --`): a value such
/// as `--with-cc-opt=-O2 -g` holds spaces but never a ` --`.
fn split_arguments(line: &str) -> Vec<String> {
    format!(" {}", line.trim())
        .split(" --")
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(|a| format!("--{a}"))
        .filter(|a| !a.starts_with("--builddir="))
        .collect()
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let shown = format!("{cmd:?}");
    let out = cmd.output().map_err(|e| format!("cannot run {shown}: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    let tail = |b: &[u8]| {
        let s = String::from_utf8_lossy(b).into_owned();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    };
    Err(format!(
        "{shown} failed ({}):\n{}\n{}",
        out.status,
        tail(&out.stdout),
        tail(&out.stderr)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_split_at_options_and_drop_the_build_directory() {
        let line = " --with-compat --with-cc-opt=-fsanitize=address -g --with-threads --builddir=/x/objs";
        assert_eq!(
            split_arguments(line),
            ["--with-compat", "--with-cc-opt=-fsanitize=address -g", "--with-threads"]
        );
        assert!(split_arguments("").is_empty());
    }

    #[test]
    fn the_project_patches_are_found_in_order() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("patches");
        let patches = patch_files(&dir).unwrap();
        assert!(!patches.is_empty());
        let mut sorted = patches.clone();
        sorted.sort();
        assert_eq!(patches, sorted);
    }
}
