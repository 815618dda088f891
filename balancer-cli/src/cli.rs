//! The command line: global connection flags, one subcommand per API use.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use lua_compat::wire::Endpoint;

use crate::endpoint_arg;
use crate::failure::EXIT_CODES_HELP;

/// Where `--help` lists the flags every subcommand takes.
const GLOBAL: &str = "Connection and output (any subcommand)";

#[derive(Debug, Parser)]
#[command(
    name = "dynamic-balancer",
    version,
    about = "Reads and changes the backends of nginx's dynamic_balancer module through its /configuration API",
    after_help = EXIT_CODES_HELP
)]
pub struct Cli {
    /// The API's server, as in nginx's `listen` for the `dynamic_balancer_api` location.
    #[arg(
        long,
        global = true,
        help_heading = GLOBAL,
        env = "DYNAMIC_BALANCER_API",
        value_name = "URL",
        default_value = "http://127.0.0.1:10246"
    )]
    pub api: String,

    /// The API's unix socket (nginx `listen unix:PATH`); used instead of --api.
    #[arg(long, global = true, help_heading = GLOBAL, value_name = "PATH")]
    pub unix: Option<PathBuf>,

    /// The bearer token of `dynamic_balancer_api_token`.
    #[arg(long, global = true, help_heading = GLOBAL, env = "DYNAMIC_BALANCER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,

    /// A file whose first line is the token (as `dynamic_balancer_api_token_file` reads it);
    /// used instead of --token.
    #[arg(long, global = true, help_heading = GLOBAL, value_name = "PATH")]
    pub token_file: Option<PathBuf>,

    /// The longest a request may take, connecting included: `10`, `2.5s`, `500ms`.
    #[arg(long, global = true, help_heading = GLOBAL, value_name = "DURATION", default_value = "10s", value_parser = duration)]
    pub timeout: Duration,

    /// `table` for people; `json` prints the API's JSON as it came, indented.
    #[arg(long, short = 'o', global = true, help_heading = GLOBAL, value_enum, default_value_t = Output::Table)]
    pub output: Output,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Lists the backends, or shows one (exit 1 if it does not exist).
    Get {
        /// A backend's name.
        name: Option<String>,
    },
    /// Creates or replaces one backend, whole (PUT).
    Put(PutArgs),
    /// Deletes one backend (exit 1 if it does not exist).
    Delete {
        /// The backend's name.
        name: String,
    },
    /// The generation, the zone, and each worker's applied generation.
    Status,
    /// Every endpoint's shared state: down, failures, connections, EWMA.
    Health,
    /// Replaces all backends with a file's JSON array (POST, ingress-nginx's body).
    Apply {
        /// The JSON array of backends; `-` reads stdin.
        #[arg(short = 'f', long = "file", value_name = "FILE")]
        file: PathBuf,
    },
    /// Prints generation changes and each worker's catch-up, until Ctrl-C or --count.
    Watch {
        /// How often to poll /configuration/status (every 20ms while a worker is behind).
        #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = duration)]
        interval: Duration,
        /// Stop after N writes (generation steps), once every worker has caught up.
        #[arg(long, value_name = "N")]
        count: Option<u64>,
    },
}

#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("source").required(true).args(["endpoints", "file"]))]
pub struct PutArgs {
    /// The backend's name (`$proxy_upstream_name`).
    pub name: String,

    /// An endpoint; repeat for more. IPv6 in brackets: `[fd00::7]:8080`. WEIGHT: 1-10000 (default 1).
    #[arg(
        long = "endpoint",
        short = 'e',
        value_name = "ADDR:PORT[@WEIGHT]",
        value_parser = endpoint_arg::parse
    )]
    pub endpoints: Vec<Endpoint>,

    /// Sends this file's backend object as it is; `-` reads stdin. The name defaults to NAME.
    #[arg(
        short = 'f',
        long = "file",
        value_name = "FILE",
        conflicts_with_all = ["algorithm", "hash_by", "max_fails", "fail_timeout"]
    )]
    pub file: Option<PathBuf>,

    /// The backend's `load-balance`.
    #[arg(long, value_enum)]
    pub algorithm: Option<Algorithm>,

    /// Consistent hashing on this nginx expression (`upstream-hash-by`, e.g. `$request_uri`).
    #[arg(long, value_name = "EXPR", conflicts_with = "algorithm")]
    pub hash_by: Option<String>,

    /// Failed attempts within --fail-timeout that take an endpoint out (0: never; default 1).
    #[arg(long, value_name = "N")]
    pub max_fails: Option<u32>,

    /// Seconds an endpoint stays out after --max-fails failures (default 10).
    #[arg(long, value_name = "SECONDS")]
    pub fail_timeout: Option<u32>,
}

/// The `load-balance` values the module knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum Algorithm {
    RoundRobin,
    Ewma,
    LeastConn,
}

impl Algorithm {
    pub fn wire_name(self) -> &'static str {
        match self {
            Algorithm::RoundRobin => "round_robin",
            Algorithm::Ewma => "ewma",
            Algorithm::LeastConn => "least_conn",
        }
    }
}

/// `10` or `2.5` (seconds), `10s`, `500ms`; more than zero.
pub fn duration(s: &str) -> Result<Duration, String> {
    let (number, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else {
        (s, 1.0)
    };
    let ok = !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    match number.parse::<f64>() {
        Ok(v) if ok && v > 0.0 && v * scale <= 86_400.0 => Ok(Duration::from_secs_f64(v * scale)),
        _ => Err(format!(
            "{s:?} is not a duration such as 10, 2.5s or 500ms (at most a day)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations() {
        assert_eq!(duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(duration("2.5s"), Ok(Duration::from_millis(2500)));
        assert_eq!(duration("500ms"), Ok(Duration::from_millis(500)));
        for bad in ["", "0", "0s", "-1", "1m", "ms", "1e3", "100000"] {
            assert!(duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn put_needs_endpoints_or_a_file_and_parses_them() {
        let parse = |args: &[&str]| Cli::try_parse_from([&["dynamic-balancer"][..], args].concat());
        assert!(parse(&["put", "web"]).is_err());
        assert!(parse(&["put", "web", "-f", "x.json", "--algorithm", "ewma"]).is_err());
        assert!(parse(&[
            "put",
            "web",
            "-e",
            "10.0.0.1:80",
            "--algorithm",
            "ewma",
            "--hash-by",
            "$uri"
        ])
        .is_err());
        assert!(parse(&["put", "web", "-e", "::1:80"]).is_err());
        let cli = parse(&[
            "put",
            "web",
            "-e",
            "10.0.0.1:80@5",
            "--endpoint",
            "[::1]:81",
            "-o",
            "json",
        ])
        .unwrap();
        assert_eq!(cli.output, Output::Json);
        let Command::Put(put) = cli.command else { panic!() };
        assert_eq!(put.endpoints.len(), 2);
        assert_eq!(put.endpoints[0].weight, Some(5));
        assert_eq!(put.endpoints[1].address, "::1");
        let cli = parse(&[
            "--unix",
            "/run/api.sock",
            "watch",
            "--count",
            "2",
            "--interval",
            "100ms",
        ])
        .unwrap();
        assert_eq!(cli.unix.as_deref(), Some(std::path::Path::new("/run/api.sock")));
        assert!(matches!(cli.command, Command::Watch { count: Some(2), .. }));
    }
}
