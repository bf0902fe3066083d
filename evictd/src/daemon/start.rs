//! Building the daemon from its options: the runtime client, the metrics port, the API
//! link, the inventory task, the node's layout, and the wake sources, each said in the log
//! as it starts. The inventory and the API run on the background runtime (`background`),
//! with clients of their own; the act step's runtime client stays on the daemon's.

use tokio::runtime::Handle;

use super::*;

/// The Kubernetes API: the reporter and the taints (`None`, said once, without an API or in
/// a dry run) and the watch on this node's pods (read-only, so also in a dry run).
async fn start_api(
    opts: Option<ApiOptions>,
    dry_run: bool,
    metrics: Arc<Metrics>,
) -> anyhow::Result<(Option<ApiWriters>, Option<ApiPodsReceiver>)> {
    let Some(opts) = &opts else {
        tracing::warn!(
            "no Kubernetes API (neither --kubeconfig nor a pod's service account): pod specs come \
             from --pods-file or the node, evictions are not recorded, and the kubelet will \
             restart the pods evictd stops"
        );
        return Ok((None, None));
    };
    let client = connect::client(opts).await?;
    let pods =
        pods::spawn_pod_watch(connect::watch_client(opts).await?, &opts.node_name, metrics.api.clone());
    if dry_run {
        tracing::info!("dry run: pod specs are read from the Kubernetes API; nothing is written to it");
        return Ok((None, Some(pods)));
    }
    tracing::info!(
        node = %opts.node_name,
        taint_effect = %opts.taint_effect,
        "recording evictions in the Kubernetes API, tainting the node while evictd's conditions are true"
    );
    let (reporter, reporter_task) =
        Reporter::spawn(client.clone(), opts.node_name.clone(), Retry::default(), metrics.api.clone());
    let (taints, taint_task) = NodeTaints::spawn(
        client,
        opts.node_name.clone(),
        opts.taint_effect,
        Retry::default(),
        metrics.api.clone(),
    );
    Ok((Some(ApiWriters { reporter, reporter_task, taints, taint_task }), Some(pods)))
}

/// /readyz waits for the API's first list of the node's pods: before it, every spec is a
/// guess.
fn ready_after_the_first_list(mut pods: ApiPodsReceiver, health: Arc<Health>, background: &Handle) {
    health.await_api_list();
    background.spawn(async move {
        if pods.wait_for(Option::is_some).await.is_ok() {
            health.api_listed();
        }
    });
}

/// The background thread's heartbeat: /healthz fails when it stops (`Health::alive`), as
/// it does for the daemon's loop.
async fn beat_background(health: Arc<Health>) {
    let mut every = tokio::time::interval(Duration::from_secs(1));
    loop {
        every.tick().await;
        health.background_beat();
    }
}

/// The runtime's client (`None`: `--cri-endpoint none`), counting its failures in `metrics`.
fn runtime_client(opts: &PressureOptions, metrics: &Metrics) -> anyhow::Result<Option<CriClient>> {
    let Some(ep) = &opts.cri_endpoint else { return Ok(None) };
    Ok(Some(
        CriClient::new(ep, opts.cri_timeout)?
            .with_stop_timeout(opts.runtime_request_timeout)
            .with_metrics(metrics.cri.clone()),
    ))
}

/// The metrics endpoint (`--metrics-addr`, with the probes too) and the probes' own
/// (`--probe-addr`).
fn serve_endpoints(opts: &RunOptions, metrics: &Arc<Metrics>, health: &Arc<Health>) -> anyhow::Result<()> {
    if let Some(addr) = opts.metrics_addr {
        let bound = endpoint::serve(addr, metrics.clone(), health.clone(), Default::default())
            .with_context(|| format!("--metrics-addr: cannot listen on {addr}"))?;
        tracing::info!("metrics on http://{bound}/metrics, probes on /healthz and /readyz");
    }
    if let Some(addr) = opts.probe_addr {
        let bound = endpoint::serve_probes(addr, health.clone(), Default::default())
            .with_context(|| format!("--probe-addr: cannot listen on {addr}"))?;
        tracing::info!("probes on http://{bound}/healthz and /readyz, connections of their own");
    }
    Ok(())
}

/// The inventory task, or, without a runtime, a snapshot that stays empty. The node's
/// capacity turns oom_score_adj back into requests: without it, inferred requests would be
/// zero and every burstable pod would look over its request. Called in the background
/// runtime's context, with a client made there.
pub(super) fn spawn_inventory(
    client: Option<&CriClient>,
    opts: &PressureOptions,
    api_pods: Option<ApiPodsReceiver>,
    kick: Arc<Notify>,
    reread_pods_file: Arc<AtomicBool>,
) -> anyhow::Result<watch::Receiver<PodList>> {
    let Some(client) = client else { return Ok(watch::channel(Arc::new(Vec::new())).1) };
    let node = &opts.signals.node;
    let capacity = node
        .read()
        .with_context(|| format!("reading the node's memory capacity from {}", node.dir.display()))?
        .capacity as i64;
    let mut inventory = Inventory::new(opts.pods_file.clone(), capacity)
        .reread_on(reread_pods_file)
        .with_annotation_trust(opts.annotation_trust.clone());
    if let Some(rx) = api_pods {
        inventory = inventory.with_api(rx);
    }
    Ok(inventory::spawn_refresh(client.clone(), inventory, opts.inventory_interval, kick))
}

/// How long start-up waits for the runtime to say where the writable layers are.
const LAYOUT_DETECTION: Duration = Duration::from_secs(2);

/// The kubelet's disk-layout detection at its first tick, the half that asks the runtime:
/// writable layers on a filesystem apart from the images' (`ImageFsInfo`) with a dedicated
/// imagefs is the split layout, and containerfs is then observed on that filesystem. Asked
/// once; a runtime that does not answer in time means no split, as for the kubelet.
async fn detect_split_containerfs(pressure: &mut PressureOptions, client: Option<&CriClient>) {
    let Some(client) = client else { return };
    let Ok(Some(dir)) = tokio::time::timeout(LAYOUT_DETECTION, client.separate_container_fs()).await else {
        return;
    };
    if pressure.fs_layout != FsLayout::DedicatedImageFs {
        tracing::warn!(
            containerfs = %dir.display(),
            "the runtime keeps the writable layers apart from the images, but imagefs is not a \
             filesystem of its own: ranking as on a single filesystem, as the kubelet does"
        );
        return;
    }
    if let Err(e) = crate::node::signals::filesystem_observations(&dir, None) {
        // In a container, the runtime's path must be mounted at the same place.
        tracing::warn!(
            containerfs = %dir.display(),
            "split containerfs, but its filesystem cannot be read ({e}): containerfs thresholds \
             are not evaluated until it can (mount it into evictd's container)"
        );
    }
    pressure.fs_layout = FsLayout::SplitContainerFs;
    pressure.signals.containerfs = Some(dir);
}

/// What evictd measures, said once at start: a missing mount or cgroup silently changes it.
fn log_sources(opts: &PressureOptions) {
    let s = &opts.signals;
    tracing::info!(
        node_cgroup = %s.node.dir.display(),
        kubepods_cgroup = %s.kubepods.as_ref().map_or("none (no allocatableMemory.available)".into(), |k| k.dir.display().to_string()),
        nodefs = %s.nodefs.display(),
        imagefs = %s.imagefs.display(),
        containerfs = %s.containerfs.as_deref().unwrap_or(&s.imagefs).display(),
        dedicated_imagefs = s.dedicated_imagefs(),
        fs_layout = opts.fs_layout.as_str(),
        cri = opts.cri_endpoint.as_deref().unwrap_or("none"),
        annotation_namespaces = %opts.annotation_trust.namespaces().collect::<Vec<_>>().join(","),
        own_pod = %opts.own_pod_uid.as_deref().unwrap_or("none (not in a pod)"),
        "observing"
    );
    if opts.dry_run {
        tracing::info!("dry run: evictd decides and reports, and stops no pod");
    }
}

impl Daemon {
    /// Starts the wake sources, metrics, the runtime client and the inventory, then
    /// observes the node once and arms every source on it.
    pub(super) async fn start(
        mut opts: RunOptions,
        tx: mpsc::Sender<Wake>,
        background: &Handle,
    ) -> anyhow::Result<Self> {
        let metrics = Arc::new(Metrics::default());
        let client = runtime_client(&opts.pressure, &metrics)?;
        // Before the sources start: the disk poll watches the filesystems the layout names.
        detect_split_containerfs(&mut opts.pressure, client.as_ref()).await;
        let stats = Arc::new(WakeStats::default());
        let sources = wake::start(&opts.wake, &opts.pressure.signals, &tx, &stats)?;
        // The disk walker wakes the pass it was asked for by; it starts with the inventory.
        let walker_wakes = tx.clone();
        drop(tx);
        let health = Arc::new(Health::new(endpoint::DEFAULT_STALL));
        health.beat();
        background.spawn(beat_background(health.clone()));
        serve_endpoints(&opts, &metrics, &health)?;
        let (api, api_pods) =
            background.spawn(start_api(opts.api.clone(), opts.pressure.dry_run, metrics.clone())).await??;
        if let Some(rx) = &api_pods {
            ready_after_the_first_list(rx.clone(), health.clone(), background);
        }
        let specs_from_api = api_pods.is_some();
        let kick = Arc::new(Notify::new());
        let reread_pods_file = Arc::new(AtomicBool::new(false));
        let (pods, inventory_client) = {
            let _on_background = background.enter();
            let client = runtime_client(&opts.pressure, &metrics)?;
            let pods = spawn_inventory(
                client.as_ref(),
                &opts.pressure,
                api_pods,
                kick.clone(),
                reread_pods_file.clone(),
            )?;
            (pods, client)
        };
        log_sources(&opts.pressure);
        if client.is_none() {
            // No runtime: the inventory stays empty, and there is nothing to wait for.
            health.set_ready();
        }
        let signals = opts.pressure.signals.clone();
        let growth = crate::node::growth::GrowthTracker::new(signals.node.dir.clone(), signals.node.version);
        let report = Report::new(opts.trace, metrics, opts.cgroups.clone(), growth);
        let emergency = opts.pressure.kill.emergency;
        let scope = NodeScope::new(&signals.node.dir, &opts.cgroups);
        let (escalate, escalated) = watch::channel(Escalation::default());
        let volume_stats_period = opts.pressure.volume_stats_period;
        let mut pressure = Pressure::new(opts.policy, opts.pressure, opts.cgroups, client, escalated);
        pressure.api = api.as_ref().map(|a| a.reporter.clone());
        pressure.specs_from_api = specs_from_api;
        protect::settle_heap();
        pressure.reader = realtime::Reader::spawn(opts.realtime_priority);
        pressure.on_killed = sources.iter().find_map(|s| s.on_killed());
        pressure.charge_clock = sources.iter().find_map(|s| s.charge_clock());
        pressure.disk_walker = DiskWalker::spawn(
            pods.clone(),
            pressure.signals.nodefs.clone(),
            volume_stats_period,
            pressure.thresholds.iter().any(|t| t.signal.resource().is_disk()),
            walker_wakes,
        );
        if let Some(client) = inventory_client {
            // Detached: it lists images every few minutes for as long as the daemon runs.
            let _on_background = background.enter();
            drop(crate::runtime::reclaim::detect_images(client, pressure.image_ages.clone()));
        }
        let thresholds = pressure.thresholds.clone();
        let obs = pressure.observe(engine_ns());
        let mut daemon = Daemon {
            pressure: Some(pressure),
            pass: None,
            pending: PendingWakes::default(),
            thresholds,
            signals,
            escalate,
            emergency,
            scope,
            inventory_dirty: false,
            sources,
            stats,
            report,
            pods,
            kick,
            api,
            health,
            policy_args: opts.policy_args,
            policy_read: None,
            reread_policy: false,
            decide_after_inventory: None,
            last_pass_pods: None,
            sources_pods: None,
            pending_policy: None,
            reread_pods_file,
            cleanup_recheck: None,
            read_behind: Default::default(),
            heap_reserve_made: Instant::now(),
        };
        daemon.first_observation(&obs);
        Ok(daemon)
    }

    /// The node as first observed: reported, and every wake source armed on it.
    fn first_observation(&mut self, obs: &Observations) {
        self.report.configured(&self.thresholds);
        self.report.signals(&self.thresholds, obs);
        self.report.wake_sources(&self.sources);
        self.report.observed(&memory_view(&self.thresholds, obs));
        self.warn_of_thresholds_within_the_emergency_level(obs);
        self.rearm(obs, 0);
        if let Some((rss, locked)) = protect::resident_and_locked() {
            tracing::info!(rss_kib = rss / 1024, locked_mappings_kib = locked / 1024, "started");
        }
    }

    /// Warns of the memory thresholds the emergency level reaches
    /// (`urgency::warn_of_thresholds_within_the_emergency_level`): at the start and for each
    /// policy a SIGHUP puts in force.
    pub(super) fn warn_of_thresholds_within_the_emergency_level(&self, obs: &Observations) {
        urgency::warn_of_thresholds_within_the_emergency_level(&self.thresholds, obs, self.emergency);
    }
}
