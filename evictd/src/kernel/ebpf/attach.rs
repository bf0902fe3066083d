//! Attaching the loaded programs: each to its tracepoint (the record layout checked in
//! tracefs, the raw tracepoint's prototype in BTF), the batched charge hook as fexit, and
//! the charge tier that results.

use std::path::Path;

use aya::{
    Ebpf,
    programs::{FExit, RawTracePoint, TracePoint, raw_trace_point::RawTracePointLink},
};
use evictd_common::tracepoints::{BATCH_PROGRAMS, PROG_PAGE_COUNTER_TRY_CHARGE};

use super::{EbpfError, ProgramStatus, TRACEPOINTS, TracepointSpec, charge_tier_of, tries_batch_hook};
use crate::{
    kernel::{
        btf::{BatchPath, BtfError, KernelBtf},
        tracefs::{self, TracefsError},
    },
    vocab::ChargeTier,
};

/// A charge program that attached at load, and its link while attached (owned here, not by
/// the program: dropping it detaches the program, from whichever task holds it).
pub(super) struct ChargeLink {
    pub(super) spec: &'static TracepointSpec,
    pub(super) link: Option<RawTracePointLink>,
}

/// What `attach_all` attached.
pub(super) struct Attached {
    pub(super) programs: Vec<ProgramStatus>,
    pub(super) charge: Vec<ChargeLink>,
    /// The batched charge hook's offsets, when it attached.
    pub(super) batch: Option<BatchPath>,
    /// Where the located field (vmscan's `order`) sits in its record.
    pub(super) reclaim_order_off: Option<u32>,
}

/// Every program this kernel allows, attached: the batched charge hook first (where the
/// kernel allows it, it sees charges at ~4 calls per MiB where the memcg stat tracepoints
/// cost 512, so they are then not attached at all), then the tracepoints. Fails when none
/// attaches, or when the tier `--charge-tier` insists on does not.
pub(super) fn attach_all(
    ebpf: &mut Ebpf,
    tracefs: &Path,
    btf: &KernelBtf,
    forced: Option<ChargeTier>,
) -> Result<Attached, EbpfError> {
    let mut programs = Vec::new();
    let mut charge = Vec::new();
    let mut reclaim_order_off = None;
    // The batched hook first: where the kernel allows it, it sees charges at ~4 calls per
    // MiB where the memcg stat tracepoints cost 512, so they are not attached at all.
    let batch = if tries_batch_hook(forced) {
        attach_batch_hook(ebpf, btf, &mut programs)
    } else {
        let why = "not attached: --charge-tier memcg-tracepoints";
        programs.push(ProgramStatus::of_fexit(PROG_PAGE_COUNTER_TRY_CHARGE, Some(why.into())));
        None
    };
    for tp in &TRACEPOINTS {
        if tp.raw && batch.is_some() {
            let why = "not attached: the batched charge hook watches charges instead";
            programs.push(ProgramStatus::of_tracepoint(tp, Some(why.into())));
            continue;
        }
        let error = match attach(ebpf, tracefs, btf, tp, &mut reclaim_order_off) {
            Ok(Some(link)) => {
                charge.push(ChargeLink { spec: tp, link: Some(link) });
                None
            }
            Ok(None) => None,
            Err(e) => Some(e.to_string()),
        };
        if let Some(e) = &error {
            tracing::warn!(tracepoint = %format!("{}:{}", tp.group, tp.name), "not attached: {e}");
        }
        programs.push(ProgramStatus::of_tracepoint(tp, error));
    }
    if programs.iter().all(|p| p.error.is_some()) {
        let why: Vec<String> = programs.iter().map(ProgramStatus::reason).collect();
        return Err(EbpfError::NothingAttached(why.join("; ")));
    }
    if let Err(tier) = charge_tier_of(forced, batch.is_some(), !charge.is_empty()) {
        let why: Vec<String> = programs
            .iter()
            .filter(|p| match tier {
                ChargeTier::BatchedChargeHook => p.is_batch_hook(),
                ChargeTier::MemcgTracepoints => p.is_memcg_stat(),
                ChargeTier::AdaptivePoll => true,
            })
            .map(ProgramStatus::reason)
            .collect();
        return Err(EbpfError::TierUnavailable { tier, why: why.join("; ") });
    }
    Ok(Attached { programs, charge, batch, reclaim_order_off })
}

pub(super) fn charge_program<'a>(
    ebpf: &'a mut Ebpf,
    program: &'static str,
) -> Result<&'a mut RawTracePoint, EbpfError> {
    ebpf.program_mut(program)
        .ok_or(EbpfError::MissingProgram(program))?
        .try_into()
        .map_err(charge_err("finding", program))
}

pub(super) fn charge_err(
    what: &'static str,
    program: &'static str,
) -> impl FnOnce(aya::programs::ProgramError) -> EbpfError {
    move |source| EbpfError::Charge { what, program, source }
}

/// Why one program was not attached.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("program {0} is missing from the eBPF object (build mismatch)")]
    Missing(&'static str),
    #[error(transparent)]
    Btf(#[from] BtfError),
    #[error(transparent)]
    RecordFormat(#[from] TracefsError),
    #[error("the verifier rejected {program}: {error}\n{log}")]
    Verifier { program: &'static str, error: aya::programs::ProgramError, log: String },
    #[error("{what} {program}: {error}")]
    Program { what: &'static str, program: &'static str, error: aya::programs::ProgramError },
    #[error(
        "the kernel refused the fexit program {program} before verifying it ({error}): it has no BPF trampolines for tracing programs"
    )]
    NoTrampolines { program: &'static str, error: aya::programs::ProgramError },
    #[error(
        "{program}: field `{field}` is at offset {off} here, but at {first:?} for the programs before it"
    )]
    LocatedElsewhere { program: &'static str, field: &'static str, off: u32, first: Option<u32> },
}

/// The batched charge hook: fexit on `page_counter_try_charge` (required) and
/// `page_counter_charge` (the forced path, where it can be traced). `None`, with the reasons
/// in `programs`, where the kernel has no BPF trampolines (this project's CI host) or the
/// functions or offsets are missing.
fn attach_batch_hook(
    ebpf: &mut Ebpf,
    btf: &KernelBtf,
    programs: &mut Vec<ProgramStatus>,
) -> Option<BatchPath> {
    let prepared = btf.batch_path().map_err(|e| e.to_string()).and_then(|path| {
        aya::Btf::from_sys_fs().map(|b| (path, b)).map_err(|e| format!("kernel BTF for fexit: {e}"))
    });
    let (path, aya_btf) = match prepared {
        Ok(p) => p,
        Err(e) => {
            programs.push(ProgramStatus::of_fexit(PROG_PAGE_COUNTER_TRY_CHARGE, Some(e)));
            return None;
        }
    };
    for name in BATCH_PROGRAMS {
        let error = attach_fexit(ebpf, &aya_btf, name).err().map(|e| e.to_string());
        let failed = error.is_some();
        if let Some(e) = &error {
            tracing::debug!(program = name, "batched charge hook: {e}");
        }
        programs.push(ProgramStatus::of_fexit(name, error));
        if failed && name == PROG_PAGE_COUNTER_TRY_CHARGE {
            return None;
        }
    }
    Some(path)
}

fn attach_fexit(ebpf: &mut Ebpf, btf: &aya::Btf, program: &'static str) -> Result<(), AttachError> {
    let prog = ebpf.program_mut(program).ok_or(AttachError::Missing(program))?;
    let prog: &mut FExit =
        prog.try_into().map_err(|error| AttachError::Program { what: "program", program, error })?;
    prog.load(program, btf).map_err(|error| match &error {
        // Refused before the verifier ran: the kernel has no BPF trampolines for tracing
        // programs (this project's CI host; Debian's kernels have them).
        aya::programs::ProgramError::LoadError { verifier_log, .. }
            if verifier_log.to_string().trim().is_empty() =>
        {
            AttachError::NoTrampolines { program, error }
        }
        _ => load_error(program)(error),
    })?;
    prog.attach().map_err(|error| AttachError::Program { what: "attaching", program, error })?;
    Ok(())
}

/// A load failure, with the verifier's log when it is the verifier's.
fn load_error(program: &'static str) -> impl Fn(aya::programs::ProgramError) -> AttachError {
    move |error| match &error {
        aya::programs::ProgramError::LoadError { verifier_log, .. } => {
            let log = verifier_log.to_string();
            AttachError::Verifier { program, error, log }
        }
        _ => AttachError::Program { what: "loading", program, error },
    }
}

/// Loads and attaches one program; a charge program (raw tracepoint) returns its link, whose
/// drop detaches it. A program reading a located field needs it where the programs
/// before it found it (`located_off`: there is one slot in the config).
fn attach(
    ebpf: &mut Ebpf,
    tracefs: &Path,
    btf: &KernelBtf,
    tp: &TracepointSpec,
    located_off: &mut Option<u32>,
) -> Result<Option<RawTracePointLink>, AttachError> {
    let program = tp.program;
    let load_err = load_error(program);
    let as_kind = |error| AttachError::Program { what: "program", program, error };
    let attach_err = |error| AttachError::Program { what: "attaching", program, error };
    let prog = ebpf.program_mut(program).ok_or(AttachError::Missing(program))?;
    if tp.raw {
        btf.check_memcg_tracepoint(tp.name)?;
        let prog: &mut RawTracePoint = prog.try_into().map_err(as_kind)?;
        prog.load().map_err(load_err)?;
        let id = prog.attach(tp.name).map_err(attach_err)?;
        return Ok(Some(prog.take_link(id).map_err(|error| AttachError::Program {
            what: "taking the link of",
            program,
            error,
        })?));
    }
    tracefs::check_record_format(tracefs, tp.group, tp.name, tp.fields)?;
    if let Some(field) = tp.located {
        let off = tracefs::locate_field(tracefs, tp.group, tp.name, field)? as u32;
        if located_off.is_some_and(|o| o != off) {
            return Err(AttachError::LocatedElsewhere {
                program,
                field: field.name,
                off,
                first: *located_off,
            });
        }
        *located_off = Some(off);
    }
    let prog: &mut TracePoint = prog.try_into().map_err(as_kind)?;
    prog.load().map_err(load_err)?;
    prog.attach(tp.group, tp.name).map_err(attach_err)?;
    Ok(None)
}
