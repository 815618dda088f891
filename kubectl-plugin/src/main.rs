//! `kubectl dynamic-balancer`: ingress-nginx's kubectl plugin
//! (`kubectl ingress-nginx backends|certs|conf|general|info|ingresses|lint|logs|exec`)
//! for this controller, plus the migration `check`. It runs on the user's
//! machine with their kubeconfig; what only the controller knows (the
//! module's backends and certificates, the running nginx.conf, its state)
//! it asks the controller's own binary inside the Pod, through the
//! apiserver's exec (book: `operating/kubectl-plugin.md`).

mod cli;
mod commands;
mod in_pod;
mod ingresses;
mod remote;
mod target;

use clap::Parser as _;

fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(commands::run(cli));
    // Not waiting for a read of this terminal's input that will never end
    // (`exec -i` whose command is done).
    rt.shutdown_background();
    match result {
        // The remote command's own code (`exec`), or 1 from `check`.
        Ok(code) => std::process::ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
