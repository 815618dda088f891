//! `dynamic-balancer`: a command-line client for the `/configuration` API of
//! nginx's `dynamic_balancer` module, for people at a terminal and for
//! scripts (`--output json`, exit codes that say what happened).
//!
//! Modules, one concept each: `cli` (flags), `endpoint_arg` (`--endpoint`),
//! `http` (HTTP/1.1 messages), `transport` (TCP or unix socket, deadline),
//! `client` (2xx or a failure), `failure` (exit codes), `bodies` (the
//! API's answers), `render` and `table` (text), `pretty` (JSON),
//! `watch` (status polls to events), `commands` (the subcommands).

mod bodies;
mod cli;
mod client;
mod commands;
mod endpoint_arg;
mod failure;
mod http;
mod pretty;
mod render;
mod table;
mod transport;
mod watch;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};
use crate::client::Client;
use crate::failure::Failure;
use crate::transport::Target;

fn main() -> ExitCode {
    // clap exits by itself: 2 on a usage error, 0 for --help and --version.
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::from(failure::code::OK),
        Err(f) => {
            eprintln!("{}", f.message());
            ExitCode::from(f.exit_code())
        }
    }
}

fn run(cli: &Cli) -> Result<(), Failure> {
    let client = Client {
        target: match &cli.unix {
            Some(path) => Target::Unix(path.clone()),
            None => Target::from_url(&cli.api).map_err(|e| Failure::Usage(format!("--api: {e}")))?,
        },
        token: token(cli)?,
        timeout: cli.timeout,
    };
    let output = cli.output;
    match &cli.command {
        Command::Get { name } => commands::get(&client, output, name.as_deref()),
        Command::Put(args) => commands::put(&client, output, args),
        Command::Delete { name } => commands::delete(&client, output, name),
        Command::Status => commands::status(&client, output),
        Command::Health => commands::health(&client, output),
        Command::Apply { file } => commands::apply(&client, output, file),
        Command::Watch { interval, count } => commands::watch(&client, output, *interval, *count),
    }
}

/// The token from `--token-file` (its first line, as the module reads
/// `dynamic_balancer_api_token_file`), else `--token`. It must pass the
/// module's own rule for configured tokens (16-4096 printable characters,
/// no spaces): a token that cannot match is a usage error, and one with a
/// line break could not smuggle a header into the request.
fn token(cli: &Cli) -> Result<Option<String>, Failure> {
    let (token, from) = match &cli.token_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| Failure::Usage(format!("--token-file: cannot read {}: {e}", path.display())))?;
            let first = text.lines().next().unwrap_or("").trim_end_matches('\r').to_string();
            (first, format!("--token-file {}", path.display()))
        }
        None => match cli.token.as_deref() {
            Some(t) if !t.is_empty() => (t.to_string(), "--token".to_string()),
            _ => return Ok(None),
        },
    };
    lua_compat::api::check_token(token.as_bytes()).map_err(|e| Failure::Usage(format!("{from}: {e}")))?;
    Ok(Some(token))
}
