//! tracefs: where tracepoints are named and their record layouts published. aya resolves a
//! tracepoint's id through it, and evictd checks each record layout against the offsets its
//! eBPF programs were compiled with before attaching them.

use std::path::{Path, PathBuf};

use evictd_common::tracepoints::{Field, LocatedField};

mod format;
pub use format::{FormatField, parse_format};

pub const CANDIDATES: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

#[derive(Debug, thiserror::Error)]
pub enum TracefsError {
    #[error(
        "tracefs is not mounted at /sys/kernel/tracing and mounting it failed: {0} (mount it with `mount -t tracefs tracefs /sys/kernel/tracing`, or give the DaemonSet the host's /sys)"
    )]
    Mount(nix::Error),
    #[error("{0} is not readable: evictd needs root (or CAP_BPF, CAP_PERFMON and access to tracefs)")]
    Denied(PathBuf),
    #[error("tracepoint {group}:{name} does not exist on this kernel ({path}: {source})")]
    NoTracepoint { group: String, name: String, path: PathBuf, source: std::io::Error },
    #[error(
        "tracepoint {group}:{name}: field `{field}` is {found} on this kernel, evictd was built for {expected}"
    )]
    Layout { group: String, name: String, field: String, found: String, expected: String },
}

/// The mounted tracefs, if any.
pub fn find() -> Option<PathBuf> {
    CANDIDATES.iter().map(PathBuf::from).find(|p| p.join("events").is_dir())
}

/// The mounted tracefs, mounting it at /sys/kernel/tracing when it is not (needs root).
pub fn ensure_mounted() -> Result<PathBuf, TracefsError> {
    if let Some(p) = find() {
        return Ok(p);
    }
    // Mounted but closed to us (tracefs is mode 0700): mounting again would only hide that.
    for c in CANDIDATES {
        if let Err(e) = std::fs::read_dir(c)
            && e.kind() == std::io::ErrorKind::PermissionDenied
        {
            return Err(TracefsError::Denied(c.into()));
        }
    }
    let target = Path::new(CANDIDATES[0]);
    nix::mount::mount(Some("tracefs"), target, Some("tracefs"), nix::mount::MsFlags::empty(), None::<&str>)
        .map_err(TracefsError::Mount)?;
    tracing::info!(path = %target.display(), "mounted tracefs (it was not mounted)");
    Ok(target.to_owned())
}

fn read_format(root: &Path, group: &str, name: &str) -> Result<Vec<FormatField>, TracefsError> {
    let path = root.join("events").join(group).join(name).join("format");
    let text = std::fs::read_to_string(&path).map_err(|source| TracefsError::NoTracepoint {
        group: group.into(),
        name: name.into(),
        path: path.clone(),
        source,
    })?;
    Ok(parse_format(&text))
}

/// The offset at which this kernel's `group:name` record has `field` (checked by name and
/// size).
pub fn locate_field(
    root: &Path,
    group: &str,
    name: &str,
    field: LocatedField,
) -> Result<usize, TracefsError> {
    let fields = read_format(root, group, name)?;
    let found = fields.iter().find(|f| f.name == field.name);
    match found {
        Some(f) if f.size == field.size => Ok(f.offset),
        _ => Err(TracefsError::Layout {
            group: group.into(),
            name: name.into(),
            field: field.name.into(),
            found: found.map_or("missing".into(), |f| format!("of size {}", f.size)),
            expected: format!("size {}", field.size),
        }),
    }
}

/// Checks that `group:name` has each expected field at its offset and size.
pub fn check_record_format(
    root: &Path,
    group: &str,
    name: &str,
    expected: &[Field],
) -> Result<(), TracefsError> {
    let fields = read_format(root, group, name)?;
    for &Field { name: field, offset, size } in expected {
        let found = fields.iter().find(|f| f.name == field);
        let ok = found.is_some_and(|f| f.offset == offset && f.size == size);
        if !ok {
            return Err(TracefsError::Layout {
                group: group.into(),
                name: name.into(),
                field: field.into(),
                found: found.map_or("missing".into(), |f| format!("at offset {} size {}", f.offset, f.size)),
                expected: format!("offset {offset} size {size}"),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMCG: &str = "name: mod_memcg_state\nID: 763\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\n\tfield:u64 id;\toffset:8;\tsize:8;\tsigned:0;\n\tfield:int item;\toffset:16;\tsize:4;\tsigned:1;\n\tfield:int val;\toffset:20;\tsize:4;\tsigned:1;\n\nprint fmt: \"memcg_id=%llu\"\n";

    #[test]
    fn parses_fields() {
        let f = parse_format(MEMCG);
        assert_eq!(f.len(), 4);
        assert_eq!(f[1], FormatField { decl: "u64 id".into(), name: "id".into(), offset: 8, size: 8 });
        let comm = parse_format("\tfield:char comm[16];\toffset:12;\tsize:16;\tsigned:0;\n");
        assert_eq!(comm[0].name, "comm");
        let loc = parse_format("\tfield:__data_loc char[] comm;\toffset:12;\tsize:4;\tsigned:0;\n");
        assert_eq!(loc[0].name, "comm");
    }

    fn field(name: &'static str, offset: usize, size: usize) -> Field {
        Field { name, offset, size }
    }

    #[test]
    fn layout_mismatch_names_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let tp = dir.path().join("events/memcg/mod_memcg_state");
        std::fs::create_dir_all(&tp).unwrap();
        std::fs::write(tp.join("format"), MEMCG).unwrap();
        check_record_format(
            dir.path(),
            "memcg",
            "mod_memcg_state",
            &[field("id", 8, 8), field("val", 20, 4)],
        )
        .unwrap();
        let err =
            check_record_format(dir.path(), "memcg", "mod_memcg_state", &[field("val", 24, 8)]).unwrap_err();
        assert!(err.to_string().contains("field `val` is at offset 20 size 4"), "{err}");
        let err =
            check_record_format(dir.path(), "memcg", "mod_memcg_state", &[field("nope", 0, 1)]).unwrap_err();
        assert!(err.to_string().contains("missing"), "{err}");
        let err = check_record_format(dir.path(), "oom", "mark_victim", &[]).unwrap_err();
        assert!(err.to_string().contains("does not exist on this kernel"), "{err}");
    }

    /// vmscan's `order` is at offset 8 up to 6.x and at 24 on Debian's 7.3 (seen in the VM
    /// matrix): found by name, its size still checked.
    #[test]
    fn a_located_field_is_found_wherever_the_kernel_puts_it() {
        let dir = tempfile::tempdir().unwrap();
        let tp = dir.path().join("events/vmscan/mm_vmscan_direct_reclaim_begin");
        std::fs::create_dir_all(&tp).unwrap();
        let order = LocatedField { name: "order", size: 4 };
        for (format, offset) in [
            ("\tfield:int order;\toffset:8;\tsize:4;\tsigned:1;\n", 8),
            (
                "\tfield:unsigned long gfp_flags;\toffset:8;\tsize:8;\tsigned:0;\n\tfield:u64 memcg_id;\toffset:16;\tsize:8;\tsigned:0;\n\tfield:int order;\toffset:24;\tsize:4;\tsigned:1;\n",
                24,
            ),
        ] {
            std::fs::write(tp.join("format"), format).unwrap();
            assert_eq!(
                locate_field(dir.path(), "vmscan", "mm_vmscan_direct_reclaim_begin", order).unwrap(),
                offset
            );
        }
        std::fs::write(tp.join("format"), "\tfield:long order;\toffset:8;\tsize:8;\tsigned:1;\n").unwrap();
        let err = locate_field(dir.path(), "vmscan", "mm_vmscan_direct_reclaim_begin", order).unwrap_err();
        assert!(err.to_string().contains("field `order` is of size 8"), "{err}");
    }
}
