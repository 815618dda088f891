//! `cargo run -p nginx-build [-- build|demo|paths]`
//!
//! - `build` (the default) installs the Debian packages the build needs when
//!   they are missing, builds nginx 1.28.3 from the `nginx-src` crate (through
//!   ngx's `vendored` feature) together with the module, and lays out
//!   `build/nginx/{sbin/nginx, modules/ngx_http_dynamic_balancer_module.so, conf/mime.types}`.
//!   Nothing is downloaded except Debian packages; the nginx source ships in
//!   the crate.
//! - `demo` builds, then runs `ingress-controller` on the bundled manifest
//!   directory (`controller/manifests/demo`), which runs nginx with the
//!   module, with three demo upstreams, until Ctrl-C.
//! - `paths` prints where the artifacts are.
//! - `image` builds everything, then the OCI image
//!   (`build/image/ingress-controller-<version>.oci.tar`, see `image.rs`);
//!   `image --assemble-only` makes the image from what is already built.
//! - `deb [--nginx-dev DIR]` builds the module against the distribution's
//!   nginx (`nginx-dev`'s tree) and packages it as Debian's module packages
//!   are: `build/deb/libnginx-mod-http-dynamic-balancer_<version>_<arch>.deb`.
//!   `deb-install` also installs it with apt (with the distribution's nginx)
//!   and links both into `build/nginx-debian`; `deb-test [TESTS...]` then
//!   runs end-to-end suites on them.
//! - `book` builds the documentation book (`docs/`, mdBook) into
//!   `build/book` and checks every internal link and anchor (`book.rs`).
//! - `gateway-crds [--check]` copies the release's standard CRDs into the
//!   chart (`gatewayAPI.crds.install`).
//! - `gateway-types [--check]` regenerates `gateway-api-types` from the
//!   Gateway API release's CRDs with kopium (`gateway_types.rs`).
//! - `asan` builds nginx and the module with AddressSanitizer into
//!   `build/nginx-asan`; `asan-test [TESTS...]` also runs the end-to-end
//!   suites against them and fails on any sanitizer report.

mod asan;
mod book;
mod build;
mod cargo;
mod chroot;
mod deb;
mod demo;
mod gateway_crds;
mod gateway_types;
mod image;
mod patched;
mod suites;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        None | Some("build") => build::build().map(|a| a.print()),
        Some("paths") => {
            build::Artifacts::locate().print();
            Ok(())
        }
        Some("image") if args.get(1).map(String::as_str) == Some("--assemble-only") => {
            image::assemble_and_commit().map(|i| i.print())
        }
        Some("image") => image::build().map(|i| i.print()),
        Some("demo") => build::build().and_then(|a| demo::run(&a, &args[1..])),
        Some("deb") => deb::build(&args[1..]).map(|p| p.print()),
        Some("deb-install") => deb::install(&args[1..]).map(|p| p.print()),
        Some("deb-test") => deb::test(&args[1..]),
        Some("book") => book::run(),
        Some("gateway-types") => gateway_types::run(&args[1..]),
        Some("gateway-crds") => gateway_crds::run(&args[1..]),
        Some("asan") => build::build_variant(build::Variant::Asan).map(|a| a.print()),
        Some("asan-test") => build::build_variant(build::Variant::Asan).and_then(|a| asan::test(&a, &args[1..])),
        Some("-h" | "--help") => {
            println!(
                "usage: cargo run -p nginx-build [-- build | demo [--port N] | paths | gateway-types [--check] | gateway-crds [--check] | image [--assemble-only] | deb [--nginx-dev DIR | --suite SUITE] | deb-install [--suite SUITE] | deb-test [--suite SUITE] [TESTS...] | book | asan | asan-test [TESTS...]]"
            );
            Ok(())
        }
        Some(other) => Err(format!("unknown command {other:?}; try --help")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nginx-build: {e}");
            ExitCode::FAILURE
        }
    }
}
