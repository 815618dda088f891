//! Supervision of the nginx master the controller runs.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::reload;
use crate::state::{Running, Shared};

/// Restarts a supervised master that died, then asks for a full push. A
/// master that had been running is restarted at once (50 ms); one that dies
/// right after it starts (a port taken, a broken binary) is restarted with
/// a growing delay, up to 10 s, so a broken installation does not loop hot.
/// A master on its first, untested configuration is not restarted: the
/// reload task tests that configuration and starts it again.
pub async fn task(shared: Arc<Shared>, running: Arc<watch::Sender<Running>>) {
    let mut delay = Duration::from_millis(50);
    loop {
        let status = shared.nginx.wait_exit().await;
        if shared.stopping.load(Ordering::Acquire) {
            return;
        }
        if shared.nginx.claim_untested_exit(&status) {
            // Its first configuration, started without `nginx -t`: the
            // reload task tests it and starts nginx again.
            tracing::warn!(%status, "nginx exited on its first configuration; the controller checks it");
            continue;
        }
        if shared.nginx.uptime() > Duration::from_secs(2) {
            delay = Duration::from_millis(50);
        }
        tracing::error!(%status, delay_ms = delay.as_millis() as u64, "nginx master exited unexpectedly; restarting");
        shared.metrics.nginx_restarts.inc();
        tokio::time::sleep(delay).await;
        delay = (delay * 4).min(Duration::from_secs(10));
        match shared.nginx.start() {
            Ok(_) => {
                if reload::wait_for_workers(&shared.api, &HashSet::new(), 1, Duration::from_secs(30))
                    .await
                    .is_ok()
                {
                    running.send_modify(|r| r.epoch += 1);
                }
            }
            Err(e) => tracing::error!(error = %format!("{e:#}"), "restarting nginx failed"),
        }
    }
}
