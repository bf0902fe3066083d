//! `evictd status`: one screen for the person on call, read from a running daemon's metrics
//! endpoint — the node's signals against their thresholds and the distance left, the wake
//! tier and sources, evictd's conditions and taints, and the last evictions with their
//! timings — so that nobody reads raw Prometheus text during an incident. In a cluster:
//! `kubectl -n kube-system exec <evictd pod> -- evictd status`.

use std::{collections::BTreeMap, fmt::Write as _, time::Duration};

use anyhow::{Context as _, anyhow};
use http_body_util::{BodyExt as _, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

use crate::report::units;

/// How long the daemon has to answer: its endpoint runs off the daemon's thread, so a busy
/// pass does not delay it.
const TIMEOUT: Duration = Duration::from_secs(5);

/// One sample of the exposition text.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Prints the status of the evictd whose metrics are at `addr` (`host:port`).
pub fn run(addr: &str) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let text = rt.block_on(scrape(addr))?;
    let samples = parse(&text).with_context(|| format!("the metrics at http://{addr}/metrics"))?;
    print!("{}", render(addr, &samples));
    Ok(())
}

async fn scrape(addr: &str) -> anyhow::Result<String> {
    let at = format!("http://{addr}/metrics");
    let fetch = async {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        let req = hyper::Request::get("/metrics").header("host", addr).body(Empty::<Bytes>::new())?;
        let resp = sender.send_request(req).await?;
        let status = resp.status();
        let body = resp.into_body().collect().await?.to_bytes();
        if !status.is_success() {
            return Err(anyhow!("HTTP {status}: {}", String::from_utf8_lossy(&body).trim()));
        }
        Ok::<_, anyhow::Error>(String::from_utf8_lossy(&body).into_owned())
    };
    tokio::time::timeout(TIMEOUT, fetch)
        .await
        .map_err(|_| anyhow!("no answer in {TIMEOUT:?}"))
        .and_then(|r| r)
        .with_context(|| {
            format!("reading evictd's metrics at {at} (is evictd running there, with --metrics-addr {addr}?)")
        })
}

/// The samples of Prometheus' text format (comments and blank lines skipped).
pub fn parse(text: &str) -> anyhow::Result<Vec<Sample>> {
    let mut samples = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        samples.push(sample(line).with_context(|| format!("line {}: {line:?}", n + 1))?);
    }
    Ok(samples)
}

fn sample(line: &str) -> anyhow::Result<Sample> {
    let name_end = line.find(['{', ' ']).ok_or_else(|| anyhow!("no value"))?;
    let name = line[..name_end].to_owned();
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(inner) = rest.strip_prefix('{') {
        let (parsed, after) = label_set(inner)?;
        labels = parsed;
        rest = after;
    }
    let value = rest.split_whitespace().next().ok_or_else(|| anyhow!("no value"))?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().map_err(|e| anyhow!("value {v:?}: {e}"))?,
    };
    Ok(Sample { name, labels, value })
}

/// `k="v",…}` (values with `\\`, `\"` and `\n` escapes), and what follows the `}`.
fn label_set(mut s: &str) -> anyhow::Result<(BTreeMap<String, String>, &str)> {
    let mut labels = BTreeMap::new();
    loop {
        s = s.trim_start_matches([',', ' ']);
        if let Some(after) = s.strip_prefix('}') {
            return Ok((labels, after));
        }
        let eq = s.find("=\"").ok_or_else(|| anyhow!("a label without a quoted value"))?;
        let key = s[..eq].to_owned();
        let mut value = String::new();
        let mut chars = s[eq + 2..].char_indices();
        let end = loop {
            match chars.next() {
                Some((i, '"')) => break eq + 2 + i + 1,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => return Err(anyhow!("an unfinished escape")),
                },
                Some((_, c)) => value.push(c),
                None => return Err(anyhow!("an unterminated label value")),
            }
        };
        labels.insert(key, value);
        s = &s[end..];
    }
}

fn find<'a>(samples: &'a [Sample], name: &str) -> impl Iterator<Item = &'a Sample> {
    let name = name.to_owned();
    samples.iter().filter(move |s| s.name == name)
}

fn label<'a>(s: &'a Sample, key: &str) -> &'a str {
    s.labels.get(key).map_or("", String::as_str)
}

/// The label values of the series of `name` that are 1 (the daemon's "which one" gauges).
fn on(samples: &[Sample], name: &str, key: &str) -> Vec<String> {
    find(samples, name).filter(|s| s.value == 1.0).map(|s| label(s, key).to_owned()).collect()
}

fn list(v: &[String]) -> String {
    if v.is_empty() { "none".into() } else { v.join(", ") }
}

/// An amount in the signal's unit: bytes in binary units, inodes and PIDs as counts.
fn amount(unit: &str, v: f64) -> String {
    if unit == "bytes" { units::bytes(v as i64) } else { format!("{v:.0}") }
}

fn millis(secs: f64) -> String {
    if secs < 0.01 { format!("{:.2}ms", secs * 1e3) } else { format!("{:.0}ms", secs * 1e3) }
}

/// The one screen.
pub fn render(addr: &str, samples: &[Sample]) -> String {
    let mut out = String::new();
    let tier = list(&on(samples, "evictd_charge_wake_tier", "tier"));
    let sources = list(&on(samples, "evictd_wake_source_active", "source"));
    let _ = writeln!(out, "evictd at {addr}: wake tier {tier}; wake sources {sources}");
    let conditions = list(&on(samples, "evictd_node_condition", "condition"));
    let taints = list(&on(samples, "evictd_node_taint", "taint"));
    let _ = writeln!(out, "conditions: {conditions}; taints: {taints}");
    let pods: Vec<String> =
        find(samples, "evictd_pods").map(|s| format!("{} {}", s.value, label(s, "spec_source"))).collect();
    let thresholds = match find(samples, "evictd_policy_thresholds").next().map(|s| s.value) {
        Some(0.0) => "WARNING: no eviction threshold: evictd evicts nothing for node pressure".to_owned(),
        Some(n) => format!("thresholds in force: {n}"),
        None => "thresholds in force: unknown (not in the metrics)".to_owned(),
    };
    let _ = writeln!(out, "pods: {}; {thresholds}", list(&pods));
    signals(&mut out, samples);
    evictions(&mut out, samples);
    out
}

/// Each signal read, its thresholds, and how far the nearest is.
fn signals(out: &mut String, samples: &[Sample]) {
    let _ = writeln!(
        out,
        "\n{:<30} {:>10} {:>10} {:>10} {:>10}  distance",
        "signal", "available", "capacity", "hard", "soft"
    );
    for unit in ["bytes", "inodes", "pids"] {
        for s in find(samples, &format!("evictd_signal_available_{unit}")) {
            let signal = label(s, "eviction_signal");
            let of = |name: &str, kind: Option<&str>| {
                find(samples, name).find(|t| {
                    label(t, "eviction_signal") == signal && kind.is_none_or(|k| label(t, "threshold") == k)
                })
            };
            let capacity = of(&format!("evictd_signal_capacity_{unit}"), None).map(|c| c.value);
            let threshold =
                |kind| of(&format!("evictd_eviction_threshold_{unit}"), Some(kind)).map(|t| t.value);
            let (hard, soft) = (threshold("hard"), threshold("soft"));
            let shown = |v: Option<f64>| v.map_or("-".into(), |v| amount(unit, v));
            let nearest = [hard, soft].into_iter().flatten().reduce(f64::max);
            let distance = match nearest {
                None => "no threshold".into(),
                Some(t) if s.value < t => format!("MET: {} below", amount(unit, t - s.value)),
                Some(t) => format!("{} above", amount(unit, s.value - t)),
            };
            let _ = writeln!(
                out,
                "{signal:<30} {:>10} {:>10} {:>10} {:>10}  {distance}",
                amount(unit, s.value),
                shown(capacity),
                shown(hard),
                shown(soft)
            );
        }
    }
}

/// The evictions so far, and the last few with their phases.
fn evictions(out: &mut String, samples: &[Sample]) {
    let by_signal: Vec<String> = find(samples, "evictd_evictions_total")
        .filter(|s| s.value > 0.0)
        .map(|s| format!("{} {}", s.value, label(s, "eviction_signal")))
        .collect();
    let failed = find(samples, "evictd_failed_evictions_total").next().map_or(0.0, |s| s.value);
    let _ = writeln!(out, "\nevictions: {}; failed: {failed}", list(&by_signal));
    let mut recent: Vec<&Sample> = find(samples, "evictd_recent_eviction_timestamp_seconds").collect();
    if recent.is_empty() {
        return;
    }
    recent.sort_by(|a, b| b.value.total_cmp(&a.value));
    let _ = writeln!(
        out,
        "last evictions, newest first:\n  {:<20} {:<40} {:<20} {:<8} {:>8} {:>8} {:>8} {:>8}",
        "decided (UTC)", "pod", "signal", "outcome", "detect", "stop", "sandbox", "freed"
    );
    for s in recent {
        let (namespace, pod) = (label(s, "namespace"), label(s, "pod"));
        let phase = |p: &str| {
            find(samples, "evictd_recent_eviction_phase_seconds")
                .find(|x| {
                    label(x, "namespace") == namespace && label(x, "pod") == pod && label(x, "phase") == p
                })
                .map_or("-".into(), |x| millis(x.value))
        };
        let when = Duration::try_from_secs_f64(s.value).map_or_else(
            |_| "?".to_owned(),
            |d| humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + d).to_string(),
        );
        let _ = writeln!(
            out,
            "  {when:<20} {:<40} {:<20} {:<8} {:>8} {:>8} {:>8} {:>8}",
            format!("{namespace}/{pod}"),
            label(s, "eviction_signal"),
            label(s, "outcome"),
            phase("detection"),
            phase("stop_containers"),
            phase("stop_sandbox"),
            phase("memory_released"),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_format_is_read_with_its_escapes() {
        let s = parse(
            "# HELP x y\n# TYPE x gauge\nevictd_pods{spec_source=\"api\"} 3\n\
             evictd_recent_eviction_timestamp_seconds{rank=\"1\",namespace=\"a\\\"b\",pod=\"p\\\\q\\nr\"} 1.5e9\n\
             evictd_policy_thresholds 6\nevictd_x_bucket{le=\"+Inf\"} +Inf\n",
        )
        .unwrap();
        assert_eq!(s.len(), 4);
        assert_eq!(s[0].labels["spec_source"], "api");
        assert_eq!(s[1].labels["namespace"], "a\"b");
        assert_eq!(s[1].labels["pod"], "p\\q\nr");
        assert_eq!(s[1].value, 1.5e9);
        assert_eq!(s[2].name, "evictd_policy_thresholds");
        assert!(s[3].value.is_infinite());
        let e = parse("evictd_pods{spec_source=\"api} 3\n").unwrap_err();
        assert!(format!("{e:#}").contains("line 1"), "{e:#}");
    }

    /// A signal past its threshold reads MET with how far; the screen says when no threshold
    /// is in force; the last evictions come newest first.
    #[test]
    fn the_screen_shows_distance_and_the_last_evictions_in_order() {
        let s = parse(
            "evictd_signal_available_bytes{eviction_signal=\"memory.available\"} 52428800\n\
             evictd_eviction_threshold_bytes{eviction_signal=\"memory.available\",threshold=\"hard\"} 104857600\n\
             evictd_policy_thresholds 0\n\
             evictd_recent_eviction_timestamp_seconds{namespace=\"a\",pod=\"older\",eviction_signal=\"memory.available\",outcome=\"evicted\"} 1.7e9\n\
             evictd_recent_eviction_timestamp_seconds{namespace=\"a\",pod=\"newer\",eviction_signal=\"memory.available\",outcome=\"evicted\"} 1.8e9\n\
             evictd_recent_eviction_phase_seconds{namespace=\"a\",pod=\"newer\",phase=\"detection\"} 0.0008\n\
             evictd_recent_eviction_timestamp_seconds{namespace=\"a\",pod=\"inf\",eviction_signal=\"memory.available\",outcome=\"evicted\"} +Inf\n",
        )
        .unwrap();
        let screen = render("x:1", &s);
        assert!(screen.contains("MET: 50.0MiB below"), "{screen}");
        assert!(screen.contains("WARNING: no eviction threshold"), "{screen}");
        let (newer, older) = (screen.find("a/newer").unwrap(), screen.find("a/older").unwrap());
        assert!(newer < older, "{screen}");
        assert!(screen.contains("0.80ms"), "{screen}");
        assert!(screen.contains("a/inf"), "a time that is no time is shown, not a panic: {screen}");
    }
}
