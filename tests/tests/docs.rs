//! The documentation's links resolve: every relative link in README.md, REVIEW.md and
//! docs/*.md names a file of the repository, and every `#anchor` a heading of its target
//! (GitHub's slugs). A page moved or a heading renamed fails here, not for a reader.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

use pulldown_cmark::{Event, Parser, Tag, TagEnd};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace").to_path_buf()
}

fn pages() -> Vec<PathBuf> {
    let root = root();
    let mut pages = vec![root.join("README.md"), root.join("REVIEW.md")];
    for entry in std::fs::read_dir(root.join("docs")).expect("docs/") {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    pages
}

/// GitHub's anchor for a heading: lower case, punctuation other than `-` and `_` dropped,
/// spaces to `-`; a repeated slug gets `-1`, `-2`, ….
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut heading: Option<String> = None;
    for event in Parser::new(markdown) {
        match event {
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::Text(t) | Event::Code(t) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                let text = heading.take().unwrap_or_default();
                let slug: String = text
                    .to_lowercase()
                    .chars()
                    .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
                    .map(|c| if c == ' ' { '-' } else { c })
                    .collect();
                let mut unique = slug.clone();
                let mut n = 0;
                while !found.insert(unique.clone()) {
                    n += 1;
                    unique = format!("{slug}-{n}");
                }
            }
            _ => {}
        }
    }
    found
}

fn links(markdown: &str) -> Vec<String> {
    Parser::new(markdown)
        .filter_map(|e| match e {
            Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. }) => {
                Some(dest_url.to_string())
            }
            _ => None,
        })
        .collect()
}

/// What is wrong with one link from `page`, if anything.
fn broken(page: &Path, link: &str) -> Option<String> {
    if link.contains("://") || link.starts_with("mailto:") {
        return None;
    }
    let (file, anchor) = link.split_once('#').map_or((link, None), |(f, a)| (f, Some(a)));
    let target = if file.is_empty() { page.to_path_buf() } else { page.parent()?.join(file) };
    if !target.exists() {
        return Some(format!("{link}: no file {}", target.display()));
    }
    let anchor = anchor?;
    if target.extension().is_none_or(|e| e != "md") {
        return None;
    }
    let text = std::fs::read_to_string(&target).ok()?;
    (!anchors(&text).contains(anchor))
        .then(|| format!("{link}: no heading #{anchor} in {}", target.display()))
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut wrong = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for link in links(&text) {
            checked += 1;
            if let Some(why) = broken(&page, &link) {
                wrong.push(format!("{}: {why}", page.display()));
            }
        }
    }
    assert!(wrong.is_empty(), "broken links:\n{}", wrong.join("\n"));
    assert!(checked > 50, "only {checked} links found: the scan is broken");
}

#[test]
fn a_missing_file_or_heading_is_found() {
    let page = root().join("README.md");
    assert!(broken(&page, "docs/no-such-page.md").is_some());
    assert!(broken(&page, "docs/testing.md#no-such-heading").is_some());
    assert!(broken(&page, "docs/testing.md#vm-test-matrix").is_none());
}

/// The README stays a front door: the manual lives in docs/.
#[test]
fn the_readme_is_a_front_door() {
    let lines = std::fs::read_to_string(root().join("README.md")).unwrap().lines().count();
    assert!(lines <= 320, "README.md has {lines} lines; move detail to docs/");
}
