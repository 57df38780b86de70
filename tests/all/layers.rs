//! The layers of the workspace, held: each top-level module of host/src
//! imports only from the rows below its own in [`LAYERS`] (see
//! docs/ARCHITECTURE.md, "Layers"), and no two files of the native crates
//! ([`CRATES`]) import each other, directly or in a longer circle.
//!
//! The scan reads the source as text, with std alone: comments, strings
//! and character literals are blanked; `#[cfg(test)]` modules and
//! `tests.rs` files are left out (a test may reach up to build its case).
//! Every path that starts at `crate`, `super`, `self` or a module the file
//! declares is taken, in `use` lines and in function bodies alike, and a
//! grouped import (`use crate::{a, b::{c, self}}`) is expanded into each
//! of its paths, so that no arrow hides in a group.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// host's top-level modules, the top row first. A module imports only
/// from the rows below its own: not from its own row, not from above. A
/// new module takes its row here.
const LAYERS: &[&[&str]] = &[
    &["cli"],
    &["app", "conformance", "demo", "template", "trace"],
    &["sync"],
    &["extension", "userspace"],
    &["family"],
    &["kernel"],
    &["validate", "serve"],
    &["state"],
    &["source", "settings"],
    &["config"],
    &["reload"],
    &["runtime"],
    &["syntax", "wellknown", "cpu_time", "scratch"],
];

/// The imports that may run up, as `file -> module` (the file under
/// host/src), each with its reason in a comment above it. None does.
const ALLOWED: &[&str] = &[];

fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn host_modules_import_only_from_the_layers_below() {
    let host = Crate::read(&manifest_dir().join("src"));
    let row: BTreeMap<&str, usize> =
        LAYERS.iter().enumerate().flat_map(|(r, modules)| modules.iter().map(move |m| (*m, r))).collect();
    let modules: BTreeSet<&str> = host.modules.iter().map(String::as_str).collect();
    let unplaced: Vec<&&str> = modules.iter().filter(|m| !row.contains_key(**m)).collect();
    assert!(unplaced.is_empty(), "modules on no row of LAYERS (give each its row): {unplaced:?}");
    let stale: Vec<&&str> = row.keys().filter(|m| !modules.contains(**m)).collect();
    assert!(stale.is_empty(), "LAYERS names modules that host/src does not declare: {stale:?}");

    let mut up = BTreeSet::new();
    for (file, toks) in &host.files {
        let me = module_path(file);
        let Some(own) = me.first() else { continue };
        for path in paths(toks, &me) {
            let Some(top) = path.first() else { continue };
            if top == own {
                continue;
            }
            if !modules.contains(top.as_str()) {
                up.insert(format!("{file} -> crate root ({top})"));
                continue;
            }
            if let (Some(to), Some(from)) = (row.get(top.as_str()), row.get(own.as_str()))
                && to <= from
            {
                up.insert(format!("{file} -> {top}"));
            }
        }
    }
    let allowed: BTreeSet<String> = ALLOWED.iter().map(|a| a.to_string()).collect();
    let new: Vec<&String> = up.difference(&allowed).collect();
    let gone: Vec<&String> = allowed.difference(&up).collect();
    assert!(
        new.is_empty(),
        "imports that run from a lower layer of host/src up to a higher one (or to the crate root); move what is \
         imported down, or the importer up: {new:#?}"
    );
    assert!(gone.is_empty(), "ALLOWED names imports that are gone; take them off: {gone:#?}");
}

/// The native crates whose files may not import each other in a circle.
const CRATES: &[&str] = &["host", "rules", "bench", "sched", "sdk", "netlab", "heap"];

#[test]
fn no_files_import_each_other_in_a_circle() {
    let workspace = manifest_dir().join("..");
    let mut found = Vec::new();
    for name in CRATES {
        let arrows = circles(Crate::read(&workspace.join(name).join("src")).arrows());
        if !arrows.is_empty() {
            let lines: Vec<String> = arrows.iter().map(|(from, to)| format!("  {from} -> {to}")).collect();
            found.push(format!("{name}/src:\n{}", lines.join("\n")));
        }
    }
    assert!(
        found.is_empty(),
        "files that import each other in a circle (a module's imports of its own parents do not count), and \
         the imports among them:\n{}",
        found.join("\n")
    );
}

/// The arrows among the files on a circle (and between two circles):
/// what is left once the files that import none of the rest, or that none
/// of the rest imports, are taken away, again and again.
fn circles(mut arrows: BTreeSet<(String, String)>) -> BTreeSet<(String, String)> {
    loop {
        let kept: BTreeSet<(String, String)> = {
            let from: BTreeSet<&String> = arrows.iter().map(|(a, _)| a).collect();
            let to: BTreeSet<&String> = arrows.iter().map(|(_, b)| b).collect();
            arrows.iter().filter(|(a, b)| to.contains(a) && from.contains(b)).cloned().collect()
        };
        if kept.len() == arrows.len() {
            return arrows;
        }
        arrows = kept;
    }
}

/// The Rust files of one crate, read for their paths.
struct Crate {
    /// Each file's tokens, tests left out, by its path under src/.
    files: BTreeMap<String, Vec<String>>,
    /// The modules the crate's root declares.
    modules: Vec<String>,
}

impl Crate {
    /// The crate whose sources are `src`: its root (lib.rs, else main.rs)
    /// and the modules under it; not src/bin/, `tests.rs` files, or files
    /// declared `#[cfg(test)] mod x;`.
    fn read(src: &Path) -> Crate {
        let root = if src.join("lib.rs").exists() { "lib.rs" } else { "main.rs" };
        let mut files = BTreeMap::new();
        let mut tests: Vec<Vec<String>> = Vec::new();
        for path in rust_files(src) {
            let file = path.strip_prefix(src).expect("under src").to_string_lossy().into_owned();
            let other_root = (file == "lib.rs" || file == "main.rs") && file != root;
            if file == "tests.rs" || file.ends_with("/tests.rs") || file.starts_with("bin/") || other_root {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let (toks, test_modules) = without_tests(tokens(&code(&text)));
            let me = module_path(&file);
            tests.extend(test_modules.into_iter().map(|m| me.iter().cloned().chain([m]).collect::<Vec<String>>()));
            files.insert(file, toks);
        }
        files.retain(|file, _| !tests.iter().any(|t| module_path(file).starts_with(t)));
        let modules = files
            .get(root)
            .unwrap_or_else(|| panic!("{} has no {root}", src.display()))
            .windows(3)
            .filter(|w| w[0] == "mod" && is_ident(&w[1]) && (w[2] == ";" || w[2] == "{"))
            .map(|w| w[1].clone())
            .collect();
        Crate { files, modules }
    }
}

impl Crate {
    /// The file that holds the module of `path`, or the nearest module
    /// above it that has a file (an item's path names its module's file).
    fn file_of(&self, path: &[String]) -> Option<String> {
        (1..=path.len()).rev().find_map(|k| {
            let base = path[..k].join("/");
            [format!("{base}.rs"), format!("{base}/mod.rs")].into_iter().find(|f| self.files.contains_key(f))
        })
    }

    /// Which file imports which, as (importer, imported). A file's imports
    /// of its own parents (`super::x`) are no arrows: a module is part of
    /// its parent.
    fn arrows(&self) -> BTreeSet<(String, String)> {
        let mut out = BTreeSet::new();
        for (file, toks) in &self.files {
            let me = module_path(file);
            for path in paths(toks, &me) {
                let Some(target) = self.file_of(&path) else { continue };
                if !me.starts_with(&module_path(&target)) {
                    out.insert((file.clone(), target));
                }
            }
        }
        out
    }
}

/// Every .rs file under `dir`, in name order.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    let mut out = Vec::new();
    for path in entries {
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
    out
}

/// The module a file under src/ holds, as its path from the crate's root
/// (`kernel/iptables/parse.rs`: kernel, iptables, parse; `lib.rs`: none).
fn module_path(file: &str) -> Vec<String> {
    let mut parts: Vec<String> = file.strip_suffix(".rs").unwrap_or(file).split('/').map(str::to_string).collect();
    if matches!(parts.last().map(String::as_str), Some("lib" | "main" | "mod")) {
        parts.pop();
    }
    parts
}

/// Every module path the code of the file of module `me` names, from the
/// crate's root: `crate::a::b`, `super::…`, `self::…`, and paths through
/// the modules it declares, each path of a group apart.
fn paths(toks: &[String], me: &[String]) -> Vec<Vec<String>> {
    let children: BTreeSet<&str> = toks
        .windows(3)
        .filter(|w| w[0] == "mod" && is_ident(&w[1]) && (w[2] == ";" || w[2] == "{"))
        .map(|w| w[1].as_str())
        .collect();
    // The inline modules (`mod x { … }`) the scan is in, with the brace depth of each.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth: usize = 0;
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let t = toks[i].as_str();
        if t == "mod" && toks.get(i + 2).is_some_and(|b| b == "{") && is_ident(&toks[i + 1]) {
            depth += 1;
            inline.push((toks[i + 1].clone(), depth));
            i += 3;
            continue;
        }
        if t == "{" {
            depth += 1;
        } else if t == "}" {
            if inline.last().is_some_and(|(_, d)| *d == depth) {
                inline.pop();
            }
            depth = depth.saturating_sub(1);
        }
        let starts = matches!(t, "crate" | "super" | "self") || children.contains(t);
        if starts && (i == 0 || toks[i - 1] != "::") && toks.get(i + 1).is_some_and(|n| n == "::") {
            let mut found = Vec::new();
            let end = tree(toks, i, &[], &mut found);
            let here: Vec<String> = me.iter().cloned().chain(inline.iter().map(|(m, _)| m.clone())).collect();
            for p in found {
                let supers = p.iter().take_while(|s| *s == "super").count();
                let absolute: Vec<String> = match p[0].as_str() {
                    "crate" => p[1..].to_vec(),
                    "self" => here.iter().chain(&p[1..]).cloned().collect(),
                    "super" if supers <= here.len() => {
                        here[..here.len() - supers].iter().chain(&p[supers..]).cloned().collect()
                    }
                    "super" => continue,
                    _ => here.iter().chain(&p).cloned().collect(),
                };
                out.push(absolute);
            }
            i = end.max(i + 1);
            continue;
        }
        i += 1;
    }
    out
}

/// The paths of the use tree (or plain path) at `toks[at]`, each after
/// `prefix`, into `out`: a group `{a, b::{c, self}}` gives a path for each
/// of its items. Returns where the tree ends.
fn tree(toks: &[String], mut at: usize, prefix: &[String], out: &mut Vec<Vec<String>>) -> usize {
    let mut path = prefix.to_vec();
    loop {
        match toks.get(at).map(String::as_str) {
            Some("{") => {
                at += 1;
                loop {
                    match toks.get(at).map(String::as_str) {
                        None => return at,
                        Some("}") => return at + 1,
                        Some(",") => at += 1,
                        Some(_) => at = tree(toks, at, &path, out).max(at + 1),
                    }
                }
            }
            Some(t) if is_ident(t) => {
                // `self` in a group is the group's own path.
                if t != "self" || path.is_empty() {
                    path.push(t.to_string());
                }
                at += 1;
                if toks.get(at).is_some_and(|n| n == "::") {
                    at += 1;
                    continue;
                }
                break;
            }
            Some("*") => {
                at += 1;
                break;
            }
            _ => break,
        }
    }
    out.push(path);
    if toks.get(at).is_some_and(|t| t == "as") {
        at += 2;
    }
    at
}

fn is_ident(t: &str) -> bool {
    t.starts_with(|c: char| c.is_alphabetic() || c == '_')
}

fn ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The tokens without `#[cfg(test)]` inline modules, and the names of the
/// `#[cfg(test)] mod x;` files they declare.
fn without_tests(toks: Vec<String>) -> (Vec<String>, Vec<String>) {
    const CFG_TEST: [&str; 7] = ["#", "[", "cfg", "(", "test", ")", "]"];
    let (mut out, mut test_modules) = (Vec::new(), Vec::new());
    let mut i = 0;
    while i < toks.len() {
        if toks.get(i..i + 7).is_some_and(|w| w.iter().zip(CFG_TEST).all(|(t, want)| t == want)) {
            let mut j = i + 7;
            while j + 1 < toks.len() && toks[j] == "#" && toks[j + 1] == "[" {
                j = close_of(&toks, j + 1) + 1;
            }
            if toks.get(j).is_some_and(|t| t == "pub") {
                j += 1;
                if toks.get(j).is_some_and(|t| t == "(") {
                    j = close_of(&toks, j) + 1;
                }
            }
            if j + 2 < toks.len() && toks[j] == "mod" && is_ident(&toks[j + 1]) {
                if toks[j + 2] == ";" {
                    test_modules.push(toks[j + 1].clone());
                    i = j + 3;
                    continue;
                }
                if toks[j + 2] == "{" {
                    i = close_of(&toks, j + 2) + 1;
                    continue;
                }
            }
        }
        out.push(toks[i].clone());
        i += 1;
    }
    (out, test_modules)
}

/// Where the bracket (`{`, `[` or `(`) at `at` is closed.
fn close_of(toks: &[String], at: usize) -> usize {
    let (open, close) = match toks[at].as_str() {
        "[" => ("[", "]"),
        "(" => ("(", ")"),
        _ => ("{", "}"),
    };
    let mut depth = 0;
    for (j, t) in toks.iter().enumerate().skip(at) {
        if t == open {
            depth += 1;
        } else if t == close {
            depth -= 1;
            if depth == 0 {
                return j;
            }
        }
    }
    toks.len() - 1
}

/// Code as tokens: identifiers (and numbers), `::`, and every other
/// character alone.
fn tokens(code: &str) -> Vec<String> {
    let c: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        if c[i].is_whitespace() {
            i += 1;
        } else if ident_char(c[i]) {
            let start = i;
            while i < c.len() && ident_char(c[i]) {
                i += 1;
            }
            out.push(c[start..i].iter().collect());
        } else if c[i] == ':' && c.get(i + 1) == Some(&':') {
            out.push("::".to_string());
            i += 2;
        } else {
            out.push(c[i].to_string());
            i += 1;
        }
    }
    out
}

/// `text` with its comments, strings and character literals blanked
/// (their line breaks kept): what is left is code.
fn code(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < c.len() {
        let start = i;
        if c[i] == '/' && c.get(i + 1) == Some(&'/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && c.get(i + 1) == Some(&'*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if let Some(n) = raw_string(&c, i) {
            i += n;
        } else if c[i] == '"' {
            i = string_end(&c, i + 1);
        } else if let Some(n) = char_literal(&c, i) {
            i += n;
        } else {
            out.push(c[i]);
            i += 1;
            continue;
        }
        out.extend(c[start..i.min(c.len())].iter().map(|&ch| if ch == '\n' { '\n' } else { ' ' }));
    }
    out
}

/// The length of the raw string (`r"…"`, `r#"…"#`, `br"…"`) that starts
/// at `i`, if one does.
fn raw_string(c: &[char], i: usize) -> Option<usize> {
    if i > 0 && ident_char(c[i - 1]) {
        return None;
    }
    let mut j = i;
    if c.get(j) == Some(&'b') {
        j += 1;
    }
    if c.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let mut hashes = 0;
    while c.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    if c.get(j) != Some(&'"') {
        return None;
    }
    j += 1;
    while j < c.len() {
        if c[j] == '"' && (1..=hashes).all(|k| c.get(j + k) == Some(&'#')) {
            return Some(j + 1 + hashes - i);
        }
        j += 1;
    }
    Some(c.len() - i)
}

/// Where the string whose text starts at `j` ends (past its closing quote).
fn string_end(c: &[char], mut j: usize) -> usize {
    while j < c.len() {
        match c[j] {
            '\\' => j += 2,
            '"' => return j + 1,
            _ => j += 1,
        }
    }
    c.len()
}

/// The length of the character literal (`'x'`, `'\n'`, `'\u{1b}'`) that
/// starts at `i`, if one does (`'a` of a lifetime is none).
fn char_literal(c: &[char], i: usize) -> Option<usize> {
    if c[i] != '\'' {
        return None;
    }
    if c.get(i + 1) == Some(&'\\') {
        let mut j = i + 3;
        while j < c.len() && c[j] != '\'' {
            j += 1;
        }
        return Some(j + 1 - i);
    }
    (c.get(i + 2) == Some(&'\'')).then_some(3)
}
