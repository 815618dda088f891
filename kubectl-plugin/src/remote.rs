//! Running a command in the controller's container through the apiserver
//! (the `pods/exec` subresource over WebSockets): no shell, no kubectl
//! and no port of the Pod's exposed to the user's machine.

use std::time::Duration;

use anyhow::{bail, Context as _};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::api::AttachParams;
use kube::Api;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// What a command printed, and how it ended.
pub struct Captured {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub code: i32,
}

/// Runs `argv` in `container` of the Pod and collects its output (for
/// the inspection subcommands, whose output is small).
pub async fn capture(
    pods: &Api<Pod>,
    pod: &str,
    container: &str,
    argv: &[String],
    timeout: Duration,
) -> anyhow::Result<Captured> {
    let run = async {
        let params = AttachParams::default()
            .container(container)
            .stdin(false)
            .stdout(true)
            .stderr(true);
        let mut proc = pods
            .exec(pod, argv.to_vec(), &params)
            .await
            .map_err(|e| exec_error(e, pod))?;
        let mut out = proc.stdout().context("exec: no stdout")?;
        let mut err = proc.stderr().context("exec: no stderr")?;
        let status = proc.take_status().context("exec: no status")?;
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        let (a, b) = tokio::join!(out.read_to_end(&mut stdout), err.read_to_end(&mut stderr));
        a?;
        b?;
        let status = status.await;
        proc.join().await.context("exec")?;
        anyhow::Ok(Captured {
            stdout,
            stderr,
            code: exit_code(status.as_ref()),
        })
    };
    tokio::time::timeout(timeout, run)
        .await
        .with_context(|| format!("{} in Pod {pod} took over {timeout:?}", argv.join(" ")))?
}

/// Runs `argv` with this process's standard output and error (and input,
/// if asked) joined to the command's; returns its exit code.
pub async fn interactive(
    pods: &Api<Pod>,
    pod: &str,
    container: &str,
    argv: &[String],
    stdin: bool,
) -> anyhow::Result<i32> {
    let params = AttachParams::default()
        .container(container)
        .stdin(stdin)
        .stdout(true)
        .stderr(true);
    let mut proc = pods
        .exec(pod, argv.to_vec(), &params)
        .await
        .map_err(|e| exec_error(e, pod))?;
    let mut out = proc.stdout().context("exec: no stdout")?;
    let mut err = proc.stderr().context("exec: no stderr")?;
    let status = proc.take_status().context("exec: no status")?;
    if let Some(mut remote_in) = proc.stdin() {
        // Ends (and closes the command's input) at this input's end.
        tokio::spawn(async move {
            let _ = tokio::io::copy(&mut tokio::io::stdin(), &mut remote_in).await;
            let _ = remote_in.shutdown().await;
        });
    }
    let copy_out = async {
        let mut o = tokio::io::stdout();
        tokio::io::copy(&mut out, &mut o).await?;
        o.flush().await
    };
    let copy_err = async {
        let mut e = tokio::io::stderr();
        tokio::io::copy(&mut err, &mut e).await?;
        e.flush().await
    };
    let (a, b) = tokio::join!(copy_out, copy_err);
    a?;
    b?;
    let status = status.await;
    Ok(exit_code(status.as_ref()))
}

/// The exit code the kubelet reports: 0 for `Success`, the `ExitCode`
/// cause for a command that ran and failed, 126 (as a shell says) when it
/// could not run at all.
pub fn exit_code(status: Option<&Status>) -> i32 {
    let Some(s) = status else {
        return 1;
    };
    if s.status.as_deref() == Some("Success") {
        return 0;
    }
    let code = s
        .details
        .as_ref()
        .and_then(|d| d.causes.as_ref())
        .into_iter()
        .flatten()
        .find(|c| c.reason.as_deref() == Some("ExitCode"))
        .and_then(|c| c.message.as_deref())
        .and_then(|m| m.parse().ok());
    if let Some(code) = code {
        return code;
    }
    if let Some(m) = &s.message {
        eprintln!("exec: {m}");
    }
    126
}

fn exec_error(e: kube::Error, pod: &str) -> anyhow::Error {
    match e {
        kube::Error::Api(s) if s.code == 403 => anyhow::anyhow!(
            "exec in Pod {pod} is forbidden for this user (RBAC: create on pods/exec in its namespace): {}",
            s.message
        ),
        e => anyhow::Error::new(e).context(format!("exec in Pod {pod}")),
    }
}

/// Output that must be JSON: a failed command's own message otherwise.
pub fn json_of(captured: &Captured, what: &str) -> anyhow::Result<serde_json::Value> {
    if captured.code != 0 {
        let err = String::from_utf8_lossy(&captured.stderr);
        // The controller logs its error as the last line of stderr, as
        // JSON with the chart's `--log-format=json`.
        let last = err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default();
        let message = serde_json::from_str::<serde_json::Value>(last)
            .ok()
            .and_then(|v| v["fields"]["message"].as_str().map(str::to_string))
            .unwrap_or_else(|| last.to_string());
        bail!("{what} failed in the Pod (exit code {}): {message}", captured.code);
    }
    serde_json::from_slice(&captured.stdout).with_context(|| {
        format!(
            "{what}: the Pod's answer is not JSON: {}",
            String::from_utf8_lossy(&captured.stdout)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_come_from_the_kubelets_status() {
        let ok: Status = serde_json::from_value(serde_json::json!({"status": "Success"})).unwrap();
        assert_eq!(exit_code(Some(&ok)), 0);
        let failed: Status = serde_json::from_value(serde_json::json!({
            "status": "Failure",
            "message": "command terminated with non-zero exit code: error executing command [nginx -t], exit code 1",
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": "3"}]}
        }))
        .unwrap();
        assert_eq!(exit_code(Some(&failed)), 3);
        let not_found: Status = serde_json::from_value(serde_json::json!({
            "status": "Failure",
            "message": "exec: \"sh\": executable file not found in $PATH"
        }))
        .unwrap();
        assert_eq!(exit_code(Some(&not_found)), 126);
        assert_eq!(exit_code(None), 1);
    }
}
