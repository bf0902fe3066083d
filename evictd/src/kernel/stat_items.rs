//! Which memcg stat items count as charge, resolved by name from the running kernel's BTF.
//! The numbers of `enum node_stat_item` and `enum memcg_stat_item` change between kernel
//! builds, so they are never compiled in.

use crate::kernel::btf::{BtfError, KernelBtf};

/// The LRU lists that make up a working set (usage − inactive_file) plus kernel memory.
/// NR_ANON_MAPPED / NR_FILE_PAGES are deliberately absent: they count the same pages as the
/// LRU items and would double every delta.
pub const DEFAULT_CHARGE_ITEMS: &[&str] =
    &["NR_INACTIVE_ANON", "NR_ACTIVE_ANON", "NR_ACTIVE_FILE", "NR_UNEVICTABLE", "MEMCG_KMEM"];

/// Every stat item that follows a charge of a memory cgroup's page counter, where the kernel
/// has it (`NR_HUGETLB` is newer than 6.1; `MEMCG_SOCK` follows charges on cgroup v2 only):
/// the charge programs count them all for the pods' bounds (`COUNTER_CHARGED_PAGES`), whatever
/// the charge items are.
pub const BOUND_ITEMS: &[&str] = &[
    "NR_INACTIVE_ANON",
    "NR_ACTIVE_ANON",
    "NR_INACTIVE_FILE",
    "NR_ACTIVE_FILE",
    "NR_UNEVICTABLE",
    "MEMCG_KMEM",
    "MEMCG_SOCK",
    "NR_HUGETLB",
];

const ENUMS: [&str; 2] = ["node_stat_item", "memcg_stat_item"];

pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

#[derive(Debug, thiserror::Error)]
pub enum StatItemError {
    #[error("{0} (evictd needs a kernel built with CONFIG_DEBUG_INFO_BTF)")]
    Btf(#[from] BtfError),
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
pub fn kernel_items(btf: &KernelBtf) -> Result<Vec<StatItem>, StatItemError> {
    let mut items = Vec::new();
    for name in ENUMS {
        for (name, value) in btf.enum_members(name)? {
            items.push(StatItem { name, value });
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

/// Those of `names` this kernel has.
pub fn present<'a>(items: &'a [StatItem], names: &[&str]) -> impl Iterator<Item = &'a StatItem> {
    items.iter().filter(move |i| names.contains(&i.name.as_str()))
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
        let err =
            StatItemError::from(KernelBtf::open(std::path::Path::new("/nonexistent/vmlinux")).err().unwrap());
        assert!(err.to_string().contains("/nonexistent/vmlinux"), "{err}");
    }

    #[test]
    fn resolves_default_items_on_this_kernel() {
        let path = std::path::Path::new(VMLINUX_BTF);
        if !path.exists() {
            crate::skip(
                "resolves_default_items_on_this_kernel",
                &format!("{VMLINUX_BTF} does not exist on this kernel"),
            );
            return;
        }
        let items =
            kernel_items(&KernelBtf::open(path).expect("open vmlinux BTF")).expect("parse vmlinux BTF");
        let chosen = select(&items, DEFAULT_CHARGE_ITEMS).expect("default items");
        assert_eq!(chosen.len(), DEFAULT_CHARGE_ITEMS.len());
        // The LRU base is 0 on every kernel since the enum was introduced.
        assert_eq!(chosen[0].value, 0);
        assert!(chosen.iter().all(|i| (i.value as usize) < evictd_common::STAT_ITEM_LIMIT));
    }
}
