//! A running `shepherd run` as an operator drives it: its admin API over
//! HTTPS, its command line on the same configuration, its `/metrics`.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use super::builds::bin;
use super::processes::ShepherdProcess;

/// The admin API of a shepherd process and its command line.
pub struct Admin {
    pub client: awc::Client,
    /// `https://host:port`.
    pub base: String,
    /// The configuration file the process runs on.
    pub config: PathBuf,
    /// The overrides it runs with (the command line gets them too).
    pub env: Vec<(&'static str, String)>,
}

impl Admin {
    /// Runs `shepherd --config … ARGS`: its stdout (panics naming stderr
    /// when it fails).
    pub fn cli(&self, args: &[&str]) -> String {
        let out = std::process::Command::new(bin("shepherd"))
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "shepherd {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// `METHOD path` with `token` (the Metal API's `X-Auth-Token`) and a
    /// JSON body: the status and the JSON answered (Null if none).
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        let url = format!("{}{path}", self.base);
        let send = || async {
            let mut req = self.client.request(
                awc::http::Method::from_bytes(method.as_bytes()).unwrap(),
                &url,
            );
            if let Some(t) = token {
                req = req.insert_header(("X-Auth-Token", t));
            }
            match &body {
                Some(b) => req.send_json(b).await,
                None => req.send().await,
            }
        };
        // A read that failed (a kept connection the server closed, a
        // handshake it dropped under load) is asked again, up to five
        // times a second apart, as an operator's client would.
        let mut tries = 0;
        let mut r = loop {
            match send().await {
                Err(e) if method == "GET" && tries < 5 => {
                    tries += 1;
                    eprintln!("{url}: {e}; asking again");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                sent => break sent.unwrap_or_else(|e| panic!("{url}: {e}")),
            }
        };
        let status = r.status().as_u16();
        let bytes = r.body().limit(64 << 20).await.unwrap();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    /// Every machine's whole record (`GET /api/v1/machines/{id}`), one
    /// request each.
    pub async fn machine_details(&self) -> Vec<Value> {
        let mut out = Vec::new();
        for m in self.machines().await {
            let id = m["machine_id"].as_str().unwrap();
            out.push(self.read(&format!("/api/v1/machines/{id}")).await.1);
        }
        out
    }

    /// `GET path`, asked again while answered 503 (the BMDB busy past
    /// `admin.database_timeout`, as under a rack's enroll storm), a
    /// quarter second apart, up to a minute, as an operator's script would.
    pub async fn read(&self, path: &str) -> (u16, Value) {
        let mut tries = 0;
        loop {
            let (status, b) = self.call("GET", path, None, None).await;
            if status != 503 || tries >= 240 {
                return (status, b);
            }
            tries += 1;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Every machine the admin API lists, page by page.
    pub async fn machines(&self) -> Vec<Value> {
        let mut all = Vec::new();
        loop {
            let path = format!("/api/v1/machines?limit=1000&offset={}", all.len());
            let (status, b) = self.read(&path).await;
            assert_eq!(status, 200, "{path}: {b}");
            let page = b["machines"].as_array().cloned().unwrap_or_default();
            let done = page.is_empty()
                || all.len() + page.len() >= b["matching"].as_u64().unwrap_or(0) as usize;
            all.extend(page);
            if done {
                return all;
            }
        }
    }

    /// Machines in each state (the list's counts).
    pub async fn counts(&self) -> std::collections::BTreeMap<String, u64> {
        let (status, b) = self.read("/api/v1/machines?limit=1").await;
        assert_eq!(status, 200, "{b}");
        serde_json::from_value(b["counts"].clone()).unwrap_or_default()
    }

    /// Waits until `n` machines are in `state` (`limit` at most,
    /// panicking with `shepherd`'s log tail and the counts then, or once
    /// it exited).
    pub async fn wait(
        &self,
        shepherd: &mut ShepherdProcess,
        state: &str,
        n: usize,
        limit: Duration,
    ) {
        shepherd
            .until(limit, Duration::from_millis(300), async || {
                let counts = self.counts().await;
                if counts.get(state).copied().unwrap_or(0) as usize >= n {
                    return Ok(());
                }
                Err(format!("not {n} machines {state}: {counts:?}"))
            })
            .await
    }

    /// Waits until the `n` devices of the project whose devices are at
    /// `path` (`/metal/v1/projects/ID/devices`) are `active`, reading
    /// them as `token`, 1,000 a page.
    pub async fn wait_active(
        &self,
        shepherd: &mut ShepherdProcess,
        path: &str,
        token: &str,
        n: usize,
        limit: Duration,
    ) {
        shepherd
            .until(limit, Duration::from_millis(500), async || {
                let (mut active, mut listed) = (0, 0);
                for page in 1..=n.div_ceil(1000) {
                    let (_, l) = self
                        .call(
                            "GET",
                            &format!("{path}?per_page=1000&page={page}"),
                            Some(token),
                            None,
                        )
                        .await;
                    let devices = l["devices"].as_array().cloned().unwrap_or_default();
                    listed += devices.len();
                    active += devices.iter().filter(|d| d["state"] == "active").count();
                }
                if active >= n {
                    return Ok(());
                }
                Err(format!("{active} of {n} devices active ({listed} listed)"))
            })
            .await
    }

    /// The sum of the `/metrics` samples named `name` whose labels
    /// contain `labels` ("" for any).
    pub async fn metric(&self, name: &str, labels: &str) -> f64 {
        let url = format!("{}/metrics", self.base);
        let mut r = self
            .client
            .get(&url)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        let body = r.body().limit(64 << 20).await.unwrap_or_default();
        String::from_utf8_lossy(&body)
            .lines()
            .filter(|l| {
                l.split([' ', '{']).next() == Some(name)
                    && (labels.is_empty() || l.contains(labels))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}
