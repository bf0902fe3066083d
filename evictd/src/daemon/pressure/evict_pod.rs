//! One pod evicted for a threshold: the candidates with their usage read off the daemon's
//! thread (for memory, only the pods that can rank first), the ranking's first pod that may
//! be taken, its record, and the act step (stop through the runtime or the fast kill, then
//! the Kubernetes record).

use evictd_policy::rank::{self, PodKeys};

use super::*;

/// Candidates tried in one decision when kills fail.
const MAX_CANDIDATES: usize = 5;

/// How long a decision waits for the candidates' cgroup reads (~2 ms for 250 pods here; a
/// disk or PID ranking reads every pod).
const CANDIDATES_READ_TIMEOUT: Duration = Duration::from_secs(2);

/// How long the kill waits for the chosen pod's containers to be read for its record
/// (a few hundred microseconds here).
const CHOSEN_READ_TIMEOUT: Duration = Duration::from_millis(20);

/// The pods a decision ranks (by index into `pods`): pods evicted already (`gone`) and pods
/// the API says have finished (the kubelet ranks only its active pods: a Failed or Succeeded
/// pod frees nothing more) are not. `keys`, where given one a pod, say which are active
/// without reading each spec.
fn live_pods<'a>(
    pods: &'a [Arc<PodRecord>],
    gone: &'a BTreeMap<String, BTreeSet<String>>,
    keys: &'a [PodKeys],
) -> impl Iterator<Item = (usize, &'a PodRecord)> {
    tracing::debug!(
        listed = pods.len(),
        evicted = pods.iter().filter(|p| gone.contains_key(&p.sandbox_id)).count(),
        finished = pods.iter().filter(|p| !p.spec.is_active()).count(),
        "candidates"
    );
    let active = move |i: usize, p: &PodRecord| keys.get(i).map_or_else(|| p.spec.is_active(), |k| k.active);
    pods.iter()
        .map(|p| &**p)
        .enumerate()
        .filter(move |&(i, p)| !gone.contains_key(&p.sandbox_id) && active(i, p))
}

fn cgroup_gone(p: &PodRecord) {
    tracing::debug!(pod = %format!("{}/{}", p.namespace, p.name), "not a candidate: its cgroup is gone");
}

/// Each live pod's usage (`live_pods`), what `reads` asks for; pods whose cgroup is gone are
/// not listed.
fn read_usage(
    pods: &[Arc<PodRecord>],
    gone: &BTreeMap<String, BTreeSet<String>>,
    cgroups: &CgroupMounts,
    disk: Option<&usage::DiskMeasured>,
    reads: usage::Reads,
) -> Vec<(usize, Result<PodStats, usage::UsageError>)> {
    live_pods(pods, gone, &[])
        .filter_map(|(i, p)| {
            let cg = usage::pod_cgroups(p, cgroups);
            if cg.as_ref().is_some_and(|c| !c.memory.dir.exists()) {
                cgroup_gone(p);
                return None;
            }
            Some((i, usage::pod_stats(p, cg.as_ref(), cgroups, disk, reads)))
        })
        .collect()
}

/// For memory ranking, the live pods that can rank first among those not `protected`, with
/// their working set read, and the pods whose usage could not be read. Each pod's usage (a
/// kept-open file, `PodUsageFiles`) bounds its working set from above; only the pods whose
/// bound could rank them first have their inactive file pages read from memory.stat
/// (`rank::read_memory_contenders`), and their working set is that usage less them, so it
/// never exceeds the bound the stop relied on; the first of them also has its containers'
/// memory read (`with_first_pods_containers`). With the node's charge count (`clock`), a
/// pod read since under an unbroken count is bounded by that read plus what the node was
/// charged since, and is read again only if that bound could rank it first: on a node of
/// many pods a decision then reads a few, not all. When no pod may be evicted, those that
/// may not are read instead, for the decision to say why (critical, protected, opted out)
/// rather than that there are no pods.
fn read_memory_candidates(
    pods: &PodList,
    gone: &BTreeMap<String, BTreeSet<String>>,
    cgroups: &CgroupMounts,
    protected: &[bool],
    files: &std::sync::Mutex<usage::PodUsageFiles>,
    signal: Signal,
    clock: Option<&ChargeClock>,
) -> (UsageReads, usize) {
    let started = Instant::now();
    with_usage_files(files, |files| {
        files.follow(pods, cgroups);
        let reads_before = files.reads();
        let ranked = MemoryRead { pods, gone, cgroups, protected, signal };
        let read = match ranked.read(files, clock) {
            Ok(read) => read,
            Err(BoundMissed { pod }) => {
                // A pod grew past what the node's charge count allowed: a charge the count
                // missed. Bounds are not to be trusted; every pod is read.
                tracing::warn!(
                    pod,
                    "a pod's usage exceeded its bound from the node's charge count: every pod's usage is read \
                     again"
                );
                files.forget_reads();
                ranked.read(files, None).unwrap_or_default()
            }
        };
        let (mut out, read) = read;
        // Read within the decision's deadline, not the record's: a container's memory.stat
        // is a part of what its pod's, just read, sums (the same hierarchy and locks), so
        // one stuck where the pod's was not is not expected. A read already slow leaves the
        // record's read to its own, shorter, deadline.
        let read = if started.elapsed() < CHOSEN_READ_TIMEOUT {
            with_first_pods_containers(read, pods, protected, files, cgroups, signal)
        } else {
            read
        };
        out.extend(read.into_iter().map(|(i, stats)| (i, Ok(stats))));
        (out, (files.reads() - reads_before) as usize)
    })
}

/// Pods (by index) with their stats, or why they could not be read.
type UsageReads = Vec<(usize, Result<PodStats, usage::UsageError>)>;

/// A pod read afresh was past the bound its earlier read and the charge count gave.
#[derive(Debug)]
struct BoundMissed {
    pod: String,
}

/// What a memory ranking reads from: the pods, and which of them may be taken.
struct MemoryRead<'a> {
    pods: &'a PodList,
    gone: &'a BTreeMap<String, BTreeSet<String>>,
    cgroups: &'a CgroupMounts,
    protected: &'a [bool],
    signal: Signal,
}

/// Pods whose usage could not be read, and the pods read for ranking, with their stats.
type MemoryReads = (UsageReads, Vec<(usize, PodStats)>);

/// A live pod's usage for ranking: read now, or bounded by an earlier read.
struct Bounded {
    pod: usize,
    read_now: Option<u64>,
    bound: u64,
    stats: PodStats,
}

impl MemoryRead<'_> {
    /// The ranking's reads (`read_memory_candidates`), bounded by earlier reads where
    /// `clock` allows.
    fn read(
        &self,
        files: &mut usage::PodUsageFiles,
        clock: Option<&ChargeClock>,
    ) -> Result<MemoryReads, BoundMissed> {
        let pods = self.pods;
        // Taken before any read below, so it bounds them all for the next decision.
        let now = clock.and_then(ChargeClock::now);
        // The specs' keys of the list just followed: one a pod, or none.
        let list_keys: Arc<[PodKeys]> = if files.follows(pods) { files.pod_keys() } else { Arc::new([]) };
        let mut out = Vec::new();
        let mut bounds = Vec::with_capacity(pods.len());
        let mut earlier = 0;
        for (i, p) in live_pods(pods, self.gone, &list_keys) {
            if let (Some(clock), Some(now)) = (clock, now)
                && let Some(bound) = files.bound(i, clock, now)
            {
                earlier += 1;
                bounds.push(Bounded {
                    pod: i,
                    read_now: None,
                    bound,
                    stats: usage::working_set_bound(bound),
                });
                continue;
            }
            match files.usage_at(i, now) {
                None => out.push((i, Err(usage::UsageError::NoCgroup))),
                Some(Ok(Some(bytes))) => bounds.push(Bounded {
                    pod: i,
                    read_now: Some(bytes),
                    bound: bytes,
                    stats: usage::working_set_bound(bytes),
                }),
                Some(Ok(None)) => cgroup_gone(p),
                Some(Err(e)) => out.push((i, Err(e.into()))),
            }
        }
        let entries: Vec<PodEntry> = bounds
            .iter()
            .map(|b| PodEntry {
                pod: &pods[b.pod].spec,
                stats: Some(&b.stats),
                protected: self.protected[b.pod],
            })
            .collect();
        // One a bounded pod, or none (`read_memory_contenders` works them out).
        let keys: Option<Vec<PodKeys>> = bounds.iter().map(|b| list_keys.get(b.pod).copied()).collect();
        let evictable = |b: usize| match keys.as_ref().and_then(|k| k.get(b)) {
            Some(k) => rank::evictable_by_keys(k, entries[b].protected),
            None => rank::evictable(&entries[b]),
        };
        let mut missed = None;
        // `bound` as of now rather than as of the decision's mark; unchanged when the two
        // marks do not compare (then a pod past it is a miss: every pod is read, the safe way).
        let grown_by_now = |bound: u64| {
            let since = (clock.zip(now)).and_then(|(c, then)| c.charged(then, c.now()?));
            bound.saturating_add(since.unwrap_or(0))
        };
        let mut exact = |b: usize| {
            // After a miss every pod is read again: nothing more is worth reading here.
            if missed.is_some() {
                return None;
            }
            let Bounded { pod: i, read_now, bound, .. } = bounds[b];
            let bytes = match read_now {
                Some(bytes) => bytes,
                None => match files.usage_at(i, now)? {
                    // Past the bound at the decision's mark, but maybe not past it by what was
                    // charged since that mark (a slow decision, a fast grower).
                    Ok(Some(bytes)) if bytes > bound && bytes > grown_by_now(bound) => {
                        missed = Some(format!("{}/{}", pods[i].namespace, pods[i].name));
                        return None;
                    }
                    Ok(Some(bytes)) => bytes,
                    Ok(None) => {
                        cgroup_gone(&pods[i]);
                        return None;
                    }
                    Err(e) => {
                        out.push((i, Err(e.into())));
                        return None;
                    }
                },
            };
            let cg = files.cgroups(i)?;
            match usage::memory_ranking_stats(&pods[i], cg, self.cgroups, bytes) {
                Ok(stats) => Some(stats),
                // Removed between its usage and its memory.stat: terminating.
                Err(_) if !cg.memory.dir.exists() => {
                    cgroup_gone(&pods[i]);
                    None
                }
                Err(e) => {
                    out.push((i, Err(e)));
                    None
                }
            }
        };
        let read: Vec<(usize, PodStats)> = if (0..entries.len()).any(evictable) {
            rank::read_memory_contenders(&entries, keys.as_deref(), 1, self.signal, &mut exact)
        } else {
            (0..entries.len()).filter_map(|b| Some((b, exact(b)?))).collect()
        };
        if let Some(pod) = missed {
            return Err(BoundMissed { pod });
        }
        let read = read.into_iter().map(|(b, stats)| (bounds[b].pod, stats)).collect::<Vec<_>>();
        tracing::debug!(
            bounded = bounds.len(),
            by_earlier_reads = earlier,
            read = read.len(),
            "memory candidates"
        );
        Ok((out, read))
    }
}

/// `read` (pods by index, with their memory ranking stats) with the containers' memory read
/// for the pod memory ranking will choose among them, for the eviction's record
/// (`Pressure::read_in_full`): read here, with the rest, a decision makes one trip to the
/// reader instead of two (~0.1 ms each here). The pick is the engine's: the same ranking of
/// the same stats and protections. Left as it is when that read fails: the record's own
/// read says why.
fn with_first_pods_containers(
    mut read: Vec<(usize, PodStats)>,
    pods: &[Arc<PodRecord>],
    protected: &[bool],
    files: &usage::PodUsageFiles,
    cgroups: &CgroupMounts,
    signal: Signal,
) -> Vec<(usize, PodStats)> {
    let entries: Vec<PodEntry> = read
        .iter()
        .map(|(i, stats)| PodEntry { pod: &pods[*i].spec, stats: Some(stats), protected: protected[*i] })
        .collect();
    let first =
        rank::rank(&entries, signal, FsLayout::SingleFs).into_iter().find(|&r| rank::evictable(&entries[r]));
    drop(entries);
    let Some(r) = first else { return read };
    let i = read[r].0;
    let full = files.cgroups(i).and_then(|cg| {
        usage::pod_stats(&pods[i], Some(cg), cgroups, None, usage::Reads::CONTAINER_MEMORY).ok()
    });
    if let Some(full) = full {
        read[r].1.containers = full.containers;
    }
    read
}

/// `f` on the shared usage files; a set of its own when a reader given up on (stuck in a
/// read) holds them. A panic while they were held left nothing half-done that matters: the
/// files are taken over.
fn with_usage_files<T>(
    files: &std::sync::Mutex<usage::PodUsageFiles>,
    f: impl FnOnce(&mut usage::PodUsageFiles) -> T,
) -> T {
    match files.try_lock() {
        Ok(mut held) => f(&mut held),
        Err(std::sync::TryLockError::Poisoned(p)) => f(&mut p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => f(&mut usage::PodUsageFiles::default()),
    }
}

/// Whether the pod's containers' memory was read with its ranking stats
/// (`with_first_pods_containers`): a pod without running containers has none to read.
fn containers_read(stats: &PodStats) -> bool {
    stats.containers.is_empty() || stats.containers.iter().any(|c| c.memory.is_some())
}

impl Pressure {
    /// `read` (of cgroup files, for the decision) on the real-time reader, or on the blocking
    /// pool without one, waited for at most `within`; `None` without an answer. A reader
    /// still in the read by then is replaced, so that the next decision's reads do not queue
    /// behind one stuck behind a kernel lock.
    pub(super) async fn read_for_decision<T: Send + 'static>(
        &mut self,
        within: Duration,
        read: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        let answer = match &self.reader {
            Some(reader) => tokio::time::timeout(within, reader.read(read)).await,
            None => {
                tokio::time::timeout(within, async { tokio::task::spawn_blocking(read).await.ok() }).await
            }
        };
        match answer {
            Ok(answer) => answer,
            Err(_) => {
                tracing::warn!(
                    "a cgroup read for the decision took longer than {within:?}: given up, and the reader \
                     replaced"
                );
                self.reader = self.reader.as_ref().and_then(|r| r.replacement());
                // A job queued on the reader given up on may never end: the new reader runs
                // its own.
                self.reader_replaced();
                None
            }
        }
    }

    /// The pods that can be ranked, with their usage read from their cgroups. A pod whose
    /// cgroup is gone is terminating, not a candidate; one evicted already is skipped until
    /// the inventory stops listing it; one whose usage cannot be read is left out and
    /// logged: ranked "without stats" it would go first, on data evictd could not read.
    /// The reads (cgroup files) run on the real-time reader (`read_for_decision`): the
    /// daemon's thread keeps serving wakes meanwhile; logs and volumes come from the disk
    /// walker's last walk.
    /// `reads`: what ranking needs beyond each pod's memory (`usage::Reads`).
    pub(super) async fn candidates<'a>(
        &mut self,
        pods: &'a PodList,
        disk: bool,
        reads: usage::Reads,
    ) -> Vec<(&'a PodRecord, PodStats)> {
        let (all, gone, cgroups) = (pods.clone(), self.gone.clone(), self.cgroups.clone());
        // Logs and volumes as last walked (none walked: no pod has disk stats).
        let disk = disk.then(|| self.disk_walker.as_ref().map(|w| w.last().measured).unwrap_or_default());
        let read = self
            .read_for_decision(CANDIDATES_READ_TIMEOUT, move || {
                read_usage(&all, &gone, &cgroups, disk.as_deref(), reads)
            })
            .await;
        self.readable(pods, read)
    }

    /// `candidates` for a memory signal: only the pods that can rank first among those not
    /// protected (`protects`, or their kill `failed` in this decision), read as
    /// `read_memory_candidates` does.
    pub(super) async fn memory_candidates<'a>(
        &mut self,
        pods: &'a PodList,
        signal: Signal,
        failed: &BTreeSet<String>,
    ) -> Vec<(&'a PodRecord, PodStats)> {
        let protected: Vec<bool> =
            pods.iter().map(|p| failed.contains(&p.sandbox_id) || self.protects(p)).collect();
        let (all, gone, cgroups, files, clock) = (
            pods.clone(),
            self.gone.clone(),
            self.cgroups.clone(),
            self.usage_files.clone(),
            self.charge_clock.clone(),
        );
        let read = self
            .read_for_decision(CANDIDATES_READ_TIMEOUT, move || {
                read_memory_candidates(&all, &gone, &cgroups, &protected, &files, signal, clock.as_ref())
            })
            .await;
        let read = read.map(|(read, pods_read)| {
            self.pods_read = Some(self.pods_read.unwrap_or(0) + pods_read);
            read
        });
        self.readable(pods, read)
    }

    /// The pods whose usage was read; the others said why, once in a while.
    fn readable<'a>(
        &mut self,
        pods: &'a [Arc<PodRecord>],
        read: Option<Vec<(usize, Result<PodStats, usage::UsageError>)>>,
    ) -> Vec<(&'a PodRecord, PodStats)> {
        let Some(usage) = read else {
            self.warn_limited("the pods' usage could not be read: no pod is ranked".into());
            return Vec::new();
        };
        let mut out = Vec::with_capacity(usage.len());
        let mut unreadable = Vec::new();
        for (i, stats) in usage {
            let p: &PodRecord = &pods[i];
            match stats {
                Ok(stats) => out.push((p, stats)),
                // A pod newer than the last walk: in the next one.
                Err(usage::UsageError::DiskNotMeasured) => {
                    tracing::debug!(pod = %format!("{}/{}", p.namespace, p.name), "left out of a disk ranking: not walked yet")
                }
                Err(e) => unreadable.push(format!("{}/{}: {e}", p.namespace, p.name)),
            }
        }
        // One line for all of them (a node of 250 pods without the pids controller would
        // otherwise log 250 a pass), each pod at debug.
        if let Some(first) = unreadable.first() {
            let ranked = if out.is_empty() { "no pod is ranked" } else { "the others are ranked" };
            self.warn_limited(format!(
                "{} pod(s) left out of ranking, their usage cannot be read ({ranked}); the first: {first}",
                unreadable.len()
            ));
            for pod in &unreadable[1..] {
                tracing::debug!("left out of ranking, its usage cannot be read: {pod}");
            }
        }
        out
    }

    /// The candidates of one try of a decision for `signal`: for memory, read anew with the
    /// pods whose kill `failed` set aside (only the pods that can rank first are read); for
    /// other signals, the first try's read serves every try (`kept`).
    async fn candidates_for_try<'a>(
        &mut self,
        pods: &'a PodList,
        signal: Signal,
        disk: bool,
        failed: &BTreeSet<String>,
        kept: Option<Vec<(&'a PodRecord, PodStats)>>,
    ) -> Vec<(&'a PodRecord, PodStats)> {
        if signal.resource() == Resource::Memory {
            return self.memory_candidates(pods, signal, failed).await;
        }
        match kept {
            Some(kept) => kept,
            None => self.candidates(pods, disk, usage::Reads::ranking(signal.resource())).await,
        }
    }

    /// Evicts the top-ranked pod for `signal`; when its kill fails with nothing of the pod
    /// stopped or killed, the next candidate (at most `MAX_CANDIDATES`), where the kubelet
    /// passes over critical pods only, and after a failed kill waits for the pod's cleanup
    /// (up to 30 s) and ranks again. Every failed kill is recorded, and the engine's state is
    /// kept whichever way the decision ends.
    pub(super) async fn evict_one(
        &mut self,
        pods: &PodList,
        signal: Signal,
        disk: bool,
        obs: &Observations,
        now: i64,
        t0: Instant,
    ) -> Vec<EvictionRecord> {
        let mut records = Vec::new();
        let mut failed: BTreeSet<String> = BTreeSet::new();
        let mut final_state = None;
        self.pods_read = None;
        let mut kept = None;
        for _ in 0..MAX_CANDIDATES {
            let candidates = self.candidates_for_try(pods, signal, disk, &failed, kept.take()).await;
            let entries: Vec<PodEntry> = candidates
                .iter()
                .map(|(p, s)| PodEntry {
                    pod: &p.spec,
                    stats: Some(s),
                    protected: failed.contains(&p.sandbox_id) || self.protects(p),
                })
                .collect();
            // Every try decides from the state before the decision: a state taken after a failed
            // try would find the same stats "not newer" and decide nothing.
            let (state, d) = engine::decide(&self.input(obs, &entries, now), &self.state);
            drop(entries);
            final_state = Some(state);
            let Some(mut e) = d.eviction else {
                self.warn_no_eviction(&d, failed.len());
                break;
            };
            let (pod, ranked) = &candidates[e.pod];
            tracing::debug!(
                pods = pods.len(),
                read = candidates.len(),
                chosen = %format!("{}/{}", pod.namespace, pod.name),
                working_set = ranked.memory.as_ref().and_then(|m| m.working_set_bytes),
                "decided among the candidates"
            );
            if self.guesses_wait(pod, signal, obs) {
                self.hold_back_guess(pod);
                break;
            }
            // Ranked on its pod-level memory; the record names its containers' usage.
            let full = self.read_in_full(pod, ranked, &mut e, &d.actionable, obs).await;
            let stats = full.as_ref().unwrap_or(ranked);
            let mut rec = self.record(pod, &e, obs, t0);
            let done = self.act(pod, stats, &mut rec).await;
            records.push(rec);
            if done {
                break;
            }
            // Only for this decision: the pod is still there, and the next pass may well
            // succeed where this one failed.
            failed.insert(pod.sandbox_id.clone());
            kept = Some(candidates);
        }
        if let Some(state) = final_state {
            self.state = state;
        }
        records
    }

    /// For a memory eviction, the chosen pod's ranked stats with its containers' memory (read
    /// with the candidates, `with_first_pods_containers`, or else now), and the eviction's
    /// message and annotations made from them, as the kubelet's name the containers over
    /// their requests.
    /// `None` for other signals, and when the read fails or is late (`CHOSEN_READ_TIMEOUT`:
    /// the kill waits for it): the record then names no container, and the log says why.
    async fn read_in_full(
        &mut self,
        pod: &PodRecord,
        ranked: &PodStats,
        e: &mut engine::Eviction,
        actionable: &[usize],
        obs: &Observations,
    ) -> Option<PodStats> {
        if e.signal.resource() != Resource::Memory {
            return None;
        }
        let full = if containers_read(ranked) {
            Some(ranked.clone())
        } else {
            let (rec, cgroups) = (pod.clone(), self.cgroups.clone());
            let read = move || {
                let cg = usage::pod_cgroups(&rec, &cgroups);
                usage::pod_stats(&rec, cg.as_ref(), &cgroups, None, usage::Reads::CONTAINER_MEMORY).ok()
            };
            let full = self.read_for_decision(CHOSEN_READ_TIMEOUT, read).await.flatten();
            // The pod's own working set stays the one it was ranked (and is awaited) by.
            full.map(|read| PodStats { containers: read.containers, ..ranked.clone() })
        };
        let Some(full) = full else {
            tracing::warn!(
                pod = %format!("{}/{}", pod.namespace, pod.name),
                "its containers' memory could not be read in time: the eviction's record names none"
            );
            return None;
        };
        let entry = PodEntry { pod: &pod.spec, stats: Some(&full), protected: false };
        (e.message, e.annotations) =
            engine::eviction_message(Resource::Memory, &entry, &self.thresholds, actionable, obs);
        Some(full)
    }

    /// With specs from the API server, a pod whose spec is only inferred (the API has not
    /// listed it yet: a late first list, a pod newer than the last watch event) may be
    /// anyone's — its priority unknown, its requests a guess — and is evicted only by a
    /// memory decision with memory below the emergency level, where waiting would let the
    /// kernel's OOM killer act. A disk or PID decision has no such killer to race: it waits
    /// whatever memory does. Short of that, a decision whose top-ranked pod is such a guess
    /// evicts nobody: taking the next, listed pod instead would take a bystander for the
    /// guess's pressure.
    pub(super) fn guesses_wait(&self, chosen: &PodRecord, signal: Signal, obs: &Observations) -> bool {
        let emergency = || {
            signal.is_memory()
                && urgency::below_emergency_level(&self.thresholds, obs, self.kill.emergency).is_some()
        };
        self.specs_from_api && chosen.spec_inferred() && !emergency()
    }

    fn hold_back_guess(&mut self, pod: &PodRecord) {
        let who = format!("{}/{}", pod.namespace, pod.name);
        if !self.repeated(&format!("guess {who}")) {
            tracing::warn!(
                pod = %who,
                "no eviction short of an emergency: the top-ranked pod is not listed by the Kubernetes \
                 API yet, its spec only inferred (priority unknown)"
            );
        }
    }

    /// Pods evictd never evicts, beyond the kubelet's critical pods: itself, and — unless
    /// `--evict-inferred-kube-system` — a `kube-system` pod whose spec it could only infer
    /// (its priority is unknown: it may well be a node's DNS, proxy or network agent).
    pub(super) fn protects(&self, p: &PodRecord) -> bool {
        let own = self.own_pod_uid.as_deref() == Some(p.uid.as_str());
        own || (p.spec_inferred() && p.namespace == "kube-system" && !self.evict_inferred_kube_system)
    }

    /// `failed` candidates were tried in this decision and are protected from here on, so
    /// the engine's reason alone ("critical, protected, or opted out") would hide that they failed.
    pub(super) fn warn_no_eviction(&mut self, d: &engine::Decision, failed: usize) {
        if let Some(why) = &d.no_eviction_reason {
            let signal = d.actionable.first().map(|&i| self.thresholds[i].signal);
            let why = match failed {
                0 => why.to_string(),
                n => format!("the eviction of {n} candidate(s) failed and no other pod can be evicted"),
            };
            self.warn_limited(format!("pressure on {signal:?} but no eviction: {why}"));
        }
    }

    pub(super) fn record(
        &self,
        pod: &PodRecord,
        e: &engine::Eviction,
        obs: &Observations,
        t0: Instant,
    ) -> EvictionRecord {
        let o = obs.get(&e.signal).copied();
        EvictionRecord {
            available: o.map_or(0, |o| o.available),
            threshold: o.map_or(0, |o| self.thresholds[e.threshold].value.resolve(o.capacity)),
            annotations: e.annotations.clone(),
            ..self.new_record(pod, EvictionCause::Signal(e.signal), self.grace_seconds(e), &e.message, t0)
        }
    }

    /// A record of a decision just taken, before the act step fills in what happened.
    pub(super) fn new_record(
        &self,
        pod: &PodRecord,
        signal: EvictionCause,
        grace_period_seconds: i64,
        message: &str,
        t0: Instant,
    ) -> EvictionRecord {
        EvictionRecord {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            signal,
            available: 0,
            threshold: 0,
            grace_period_seconds,
            message: message.to_owned(),
            annotations: Default::default(),
            dry_run: self.dry_run,
            error: None,
            decide_us: t0.elapsed().as_micros() as u64,
            pods_read: self.pods_read,
            phases: None,
            wake_cause: None,
            wake_kernel_ts_ns: None,
            wake_received_ns: None,
            observed_ns: 0,
            decided_ns: monotonic_ns(),
            released_ns: None,
        }
    }

    /// Stops the pod (or, in a dry run, says it would). True when this decision is done:
    /// evicted, dry run, or nothing to evict with; false when the kill failed and the next
    /// candidate may be tried. What the next decisions keep of an evicted pod:
    /// `remember_evicted`.
    pub(super) async fn act(&mut self, pod: &PodRecord, stats: &PodStats, rec: &mut EvictionRecord) -> bool {
        let who = format!("{}/{}", rec.namespace, rec.name);
        if self.dry_run {
            // Every wake repeats the same decision while the pressure lasts.
            if !self.repeated(&format!("would evict {who}")) {
                tracing::info!(
                    pod = %who, signal = %rec.signal, available = rec.available, threshold = rec.threshold,
                    grace = rec.grace_period_seconds, "dry run: would evict: {}", rec.message
                );
            }
            return true;
        }
        let Some(client) = &self.client else {
            rec.error = Some("no CRI endpoint".into());
            return true;
        };
        let plan = self.stop_plan(pod, rec.grace_period_seconds);
        // Queued, never awaited: the kill does not wait for the API server.
        if let Some(api) = &self.api {
            api.pod_disruption(rec);
        }
        let stopped = evict::stop(client, pod, &plan, Some(self.escalate.clone())).await;
        if let (Err(err), Some(api)) = (&stopped, &self.api) {
            api.pod_disruption_failed(rec, &err.to_string());
        }
        match stopped {
            Ok(mut phases) => {
                // Recorded the moment the pod is stopped: until the API server has the
                // status, the kubelet may restart it.
                if let Some(api) = &self.api {
                    api.pod_evicted(rec, monotonic_ns());
                }
                evict::wait_released(pod, &plan, &mut phases).await;
                rec.released_ns = phases.memory_released_ms.map(|_| monotonic_ns());
                self.remember_evicted(pod, stats, rec.signal, &phases);
                tracing::info!(
                    pod = %who, signal = %rec.signal, available = rec.available, threshold = rec.threshold,
                    grace = rec.grace_period_seconds, decide_us = rec.decide_us,
                    stop_containers_ms = phases.stop_containers_ms,
                    stop_sandbox_ms = phases.stop_sandbox_ms,
                    memory_released_ms = ?phases.memory_released_ms,
                    "evicted: {}", rec.message
                );
                rec.phases = Some(phases);
                true
            }
            // The runtime is down or went away: the next candidate would fail the same way,
            // or worse, be stopped once it is back while this pod's stop is still under way.
            // The next pass tries again.
            Err(err) if err.runtime_unavailable() => {
                self.warn_limited(format!("eviction failed, the runtime is unavailable: {err}"));
                rec.error = Some(err.to_string());
                true
            }
            Err(err) => {
                tracing::warn!("eviction failed, trying the next candidate: {err}");
                rec.error = Some(err.to_string());
                false
            }
        }
    }

    /// What the next decisions keep of a pod just evicted (the kubelet's `waitForPodsCleanup`
    /// after each eviction): the pod as gone until the inventory stops listing it, and, for
    /// memory, its memory awaited (`stats`: as it was chosen); for disk, its teardown.
    fn remember_evicted(
        &mut self,
        pod: &PodRecord,
        stats: &PodStats,
        cause: EvictionCause,
        phases: &crate::vocab::Phases,
    ) {
        // A container still running is not gone: the pod is ranked again if the runtime
        // lists it running once the inventory catches up.
        let stopped = pod.containers.iter().filter(|c| !phases.still_running.contains(&c.id));
        self.gone.insert(pod.sandbox_id.clone(), stopped.map(|c| c.id.clone()).collect());
        match cause {
            EvictionCause::Signal(s) if s.is_memory() => {
                self.cleanups.push(Cleanup::after_kill(pod, self.cgroups_of(pod).map(|c| c.memory), stats))
            }
            EvictionCause::Signal(s) if !s.resource().is_disk() => {}
            EvictionCause::Signal(_) | EvictionCause::Limit(_) => {
                let cgroup = self.cgroups_of(pod).map(|c| c.memory.dir);
                self.disk_cleanups.push(DiskCleanup::after_eviction(pod, &self.signals.nodefs, cgroup));
            }
        }
        // Its dead containers are for the next node-level reclaim to remove.
        self.reclaimed_in_vain = None;
    }

    /// The grace period a decision stops its pod with: the engine's, except that a hard
    /// eviction's is `--hard-eviction-grace-period` (the kubelet's 1 s by default).
    pub(super) fn grace_seconds(&self, e: &engine::Eviction) -> i64 {
        if self.thresholds[e.threshold].is_hard() {
            self.kill.hard_grace_seconds
        } else {
            e.grace_period_seconds
        }
    }

    pub(super) fn stop_plan(&self, pod: &PodRecord, grace_seconds: i64) -> StopPlan {
        StopPlan {
            grace_seconds,
            hard_grace_seconds: self.kill.hard_grace_seconds,
            target: KillTarget::of(pod, &self.cgroups).ok(),
            fast_kill: self.kill.fast_kill,
            release_timeout: self.release_timeout,
            on_killed: self.on_killed.clone(),
        }
    }

    pub(super) fn cgroups_of(&self, p: &PodRecord) -> Option<usage::PodCgroups> {
        usage::pod_cgroups(p, &self.cgroups)
    }
}
