//! Which memcg stat items count as charge, resolved by name from the running kernel's BTF.
//! The numbers of `enum node_stat_item` and `enum memcg_stat_item` change between kernel
//! builds, so they are never compiled in.

use std::path::Path;

/// The LRU lists that make up a working set (usage − inactive_file) plus kernel memory.
/// NR_ANON_MAPPED / NR_FILE_PAGES are deliberately absent: they count the same pages as the
/// LRU items and would double every delta.
pub const DEFAULT_CHARGE_ITEMS: &[&str] =
    &["NR_INACTIVE_ANON", "NR_ACTIVE_ANON", "NR_ACTIVE_FILE", "NR_UNEVICTABLE", "MEMCG_KMEM"];

const ENUMS: [&str; 2] = ["node_stat_item", "memcg_stat_item"];

pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

#[derive(Debug, thiserror::Error)]
pub enum StatItemError {
    #[error("reading kernel BTF {path}: {reason} (evictd needs a kernel built with CONFIG_DEBUG_INFO_BTF)")]
    Btf { path: String, reason: String },
    #[error("stat item {0} is not in enum node_stat_item or memcg_stat_item of this kernel")]
    Unknown(String),
}

/// A stat item and its number on this kernel.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct StatItem {
    pub name: String,
    pub value: u32,
}

/// All members of the two stat enums, by name.
pub fn kernel_items(btf_path: &Path) -> Result<Vec<StatItem>, StatItemError> {
    let btf_err =
        |e: btf_rs::Error| StatItemError::Btf { path: btf_path.display().to_string(), reason: e.to_string() };
    // Mmap keeps the daemon's RSS small: the parsed vmlinux BTF would cost tens of MiB.
    let btf = btf_rs::Btf::from_file_with_backend(btf_path, btf_rs::Backend::Mmap).map_err(btf_err)?;
    let mut items = Vec::new();
    for name in ENUMS {
        let types = btf.resolve_types_by_name(name).map_err(btf_err)?;
        for t in types {
            if let btf_rs::Type::Enum(e) = t {
                for m in &e.members {
                    items.push(StatItem { name: btf.resolve_name(m).map_err(btf_err)?, value: m.val() });
                }
            }
        }
    }
    Ok(items)
}

/// Resolves `names` against `items`; every name must exist.
pub fn select(items: &[StatItem], names: &[impl AsRef<str>]) -> Result<Vec<StatItem>, StatItemError> {
    names
        .iter()
        .map(|n| {
            let n = n.as_ref();
            items.iter().find(|i| i.name == n).cloned().ok_or_else(|| StatItemError::Unknown(n.to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_names_are_errors() {
        let items = vec![StatItem { name: "NR_ACTIVE_ANON".into(), value: 1 }];
        assert_eq!(select(&items, &["NR_ACTIVE_ANON"]).unwrap()[0].value, 1);
        let err = select(&items, &["NR_BOGUS"]).unwrap_err();
        assert!(err.to_string().contains("NR_BOGUS"));
    }

    #[test]
    fn missing_btf_names_the_file() {
        let err = kernel_items(Path::new("/nonexistent/vmlinux")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/vmlinux"), "{err}");
    }

    #[test]
    fn resolves_default_items_on_this_kernel() {
        let path = Path::new(VMLINUX_BTF);
        if !path.exists() {
            use std::io::Write as _;
            // Not eprintln!: libtest would swallow it, and a skip must be seen.
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED resolves_default_items_on_this_kernel: {VMLINUX_BTF} does not exist on this kernel"
            );
            return;
        }
        let items = kernel_items(path).expect("parse vmlinux BTF");
        let chosen = select(&items, DEFAULT_CHARGE_ITEMS).expect("default items");
        assert_eq!(chosen.len(), DEFAULT_CHARGE_ITEMS.len());
        // The LRU base is 0 on every kernel since the enum was introduced.
        assert_eq!(chosen[0].value, 0);
        assert!(chosen.iter().all(|i| (i.value as usize) < evictd_common::STAT_ITEM_LIMIT));
    }
}
