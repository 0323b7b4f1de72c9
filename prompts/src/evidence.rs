//! Evidence at the grain of a sentence: the passages a run read, cut into
//! self-contained *units* (a sentence, a list item with its heading, a
//! short code block joined to the sentence that introduces it) and ranked
//! by relevance to the question with BM25 over the units (their section
//! heading as much; their source's title, search rank and the kind of
//! answer the question asks for a little). This is what a grounded
//! answer on a small model is composed of, what the labelled excerpt shows
//! when no answer could be written, and what a voice reply speaks.
//!
//! Pure text work: no model, no I/O.

use rust_stemmers::{Algorithm, Stemmer};
use std::collections::{BTreeSet, HashMap, HashSet};

/// A passage read in the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Passage {
    /// The source handle (`S3`).
    pub handle: String,
    /// The source title.
    pub title: String,
    /// The text read.
    pub text: String,
    /// The heading of the section the text continues (a segment that
    /// starts inside a section); may be empty.
    pub heading: String,
    /// The passage's place in the search that found it (1 = best), when a
    /// search found it.
    pub rank: Option<usize>,
}

/// A self-contained piece of a passage.
#[derive(Debug, Clone, PartialEq)]
pub struct Unit {
    /// The handle of the passage it comes from.
    pub handle: String,
    /// The text, on one line, markdown links reduced to their text.
    pub text: String,
    /// The heading of the section it stands under (may be empty).
    pub heading: String,
    /// Its relevance to the question (higher is better).
    pub score: f64,
    /// Its order in the passages (passage, then place in the passage).
    pub order: (usize, usize),
}

/// Longest unit kept (characters); longer sentences are cut at a word.
pub const UNIT_MAX: usize = 320;

/// Words that carry no topic in a question or a passage.
const STOP: &[&str] = &[
    "a", "about", "actually", "after", "all", "also", "am", "an", "and", "any", "are", "as", "at",
    "be", "been", "before", "being", "but", "by", "can", "could", "did", "do", "does", "doing",
    "don", "each", "exactly", "for", "from", "get", "gets", "give", "gives", "had", "has", "have",
    "having", "here", "how", "i", "if", "in", "instead", "into", "is", "it", "its", "just", "me",
    "might", "more", "most", "much", "my", "need", "no", "not", "of", "on", "one", "only", "or",
    "other", "our", "out", "over", "own", "really", "same", "should", "so", "some", "such", "t",
    "tell", "than", "that", "the", "their", "them", "then", "there", "these", "they", "this",
    "those", "through", "to", "too", "under", "until", "up", "us", "use", "very", "want", "was",
    "way", "we", "were", "what", "whats", "when", "where", "which", "while", "who", "whom", "why",
    "will", "with", "would", "you", "your", "s", "re", "ve", "ll", "d", "m",
];

fn is_stop(w: &str) -> bool {
    STOP.contains(&w)
}

/// The topic terms of a text: lowercase words and numbers, stop words
/// dropped, stemmed.
pub fn terms(text: &str) -> Vec<String> {
    // The Snowball English stemmer (the one tantivy's `en_stem` uses), so
    // `removal` meets `remove` and `requests` meets `request`.
    thread_local! {
        static STEMMER: Stemmer = Stemmer::create(Algorithm::English);
    }
    STEMMER.with(|st| {
        text.split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .map(str::to_lowercase)
            .filter(|w| !is_stop(w))
            .map(|w| st.stem(&w).into_owned())
            .collect()
    })
}

/// The topic words of a question as a search query (stop words dropped;
/// the question itself when it has none).
pub fn query(question: &str) -> String {
    let words: Vec<&str> = question
        .split(|c: char| !c.is_alphanumeric() && c != '-' && c != '_')
        .filter(|w| !w.is_empty() && !is_stop(&w.to_lowercase()))
        .collect();
    if words.is_empty() {
        question.to_owned()
    } else {
        words.join(" ")
    }
}

/// Markdown links `[text](target)`, `[text][ref]` and `[text][]` reduced
/// to `text`; emphasis markers dropped; whitespace collapsed.
fn clean(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find(']').map(|i| open + i) else { break };
        let after = &rest[close + 1..];
        let target_end = match after.chars().next() {
            Some('(') => after.find(')'),
            Some('[') => after.find(']'),
            _ => None,
        };
        out.push_str(&rest[..open]);
        match target_end {
            Some(end) => {
                out.push_str(&rest[open + 1..close]);
                rest = &after[end + 1..];
            }
            None => {
                out.push_str(&rest[open..=close]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    let out = out.replace("**", "").replace("__", "");
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `text` without its HTML comments (`<!-- … -->`, which docs use for
/// metadata such as version histories); an unclosed one runs to the end.
fn uncommented(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find("<!--") {
        out.push_str(&rest[..open]);
        match rest[open + 4..].find("-->") {
            Some(end) => rest = &rest[open + 4 + end + 3..],
            None => rest = "",
        }
    }
    out.push_str(rest);
    out
}

/// Cuts `s` to at most `max` characters at a word boundary, marking the cut.
fn bound(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let cut: String = s.chars().take(max).collect();
    let at = cut.rfind(' ').unwrap_or(cut.len());
    format!("{}…", cut[..at].trim_end())
}

/// Splits a paragraph into sentences (at `.`, `?`, `!` followed by a space
/// and an upper-case letter, a digit, a quote or a backtick; not after
/// `e.g.`, `i.e.`, `etc.`, `vs.`).
fn sentences(p: &str) -> Vec<String> {
    let mut out = Vec::new();
    let b: Vec<char> = p.chars().collect();
    let mut start = 0;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if matches!(c, '.' | '?' | '!') && i + 2 < b.len() && b[i + 1] == ' ' {
            let next = b[i + 2];
            let opens = next.is_uppercase() || next.is_ascii_digit() || "`\"'(*".contains(next);
            let word: String = b[start..i]
                .iter()
                .rev()
                .take_while(|c| !c.is_whitespace())
                .collect::<String>()
                .chars()
                .rev()
                .collect::<String>()
                .to_lowercase();
            let abbrev = ["e.g", "i.e", "etc", "vs", "cf"].contains(&word.as_str());
            if opens && !abbrev {
                out.push(b[start..=i].iter().collect::<String>().trim().to_owned());
                start = i + 2;
                i += 2;
                continue;
            }
        }
        i += 1;
    }
    let last: String = b[start..].iter().collect::<String>().trim().to_owned();
    if !last.is_empty() {
        out.push(last);
    }
    out
}

/// Whether a sentence opens with a word that points back to the one
/// before it (`This`, `That`, `These`, `Those`, `It`, `They`).
fn points_back(sentence: &str) -> bool {
    let first = sentence.split_whitespace().next().unwrap_or_default();
    ["This", "That", "These", "Those", "It", "They", "Such"].contains(&first)
}

fn list_item(line: &str) -> Option<&str> {
    let t = line.trim_start();
    for m in ["* ", "- ", "+ "] {
        if let Some(r) = t.strip_prefix(m) {
            return Some(r);
        }
    }
    let digits = t.chars().take_while(char::is_ascii_digit).count();
    if digits > 0 && digits < 4 {
        let r = &t[digits..];
        if let Some(r) = r.strip_prefix(". ").or_else(|| r.strip_prefix(") ")) {
            return Some(r);
        }
    }
    None
}

/// Most items a list may have to be said as one unit.
const LIST_ITEMS: usize = 8;
/// Most words an item of such a list may have.
const ITEM_WORDS: usize = 15;

/// The units being collected from a passage.
#[derive(Default)]
struct Collect {
    out: Vec<(String, String)>,
    heading: String,
    /// The paragraph being read.
    para: String,
    /// The list being read: its items, and the sentence that introduced
    /// it (one ending with `:`).
    list: Vec<String>,
    intro: Option<String>,
}

impl Collect {
    fn push(&mut self, text: &str) {
        self.out.push((bound(text, UNIT_MAX), self.heading.clone()));
    }

    /// Ends the paragraph: its sentences are units, except that a sentence
    /// that opens by pointing back ("This directory is…", "It will…")
    /// is not self-contained: it joins the sentence before it (one such
    /// sentence per unit, within the unit's length).
    fn end_para(&mut self) {
        let p = clean(&std::mem::take(&mut self.para));
        let mut units: Vec<(String, bool)> = Vec::new();
        for s in sentences(&p) {
            match units.last_mut() {
                Some((prev, joined))
                    if !*joined
                        && points_back(&s)
                        && prev.chars().count() + 1 + s.chars().count() <= UNIT_MAX =>
                {
                    prev.push(' ');
                    prev.push_str(&s);
                    *joined = true;
                }
                _ => units.push((s, false)),
            }
        }
        for (u, _) in units {
            self.push(&u);
        }
    }

    /// Ends the list item being read.
    fn end_item(&mut self) {
        let p = clean(&std::mem::take(&mut self.para));
        if !p.is_empty() {
            self.list.push(p);
        }
    }

    /// Ends the list: a short list of short items is one unit, led by
    /// what introduced it (or its heading); a longer one is a unit per
    /// item, a short item led by its heading.
    fn end_list(&mut self) {
        self.end_item();
        let items = std::mem::take(&mut self.list);
        let intro = self.intro.take();
        if items.is_empty() {
            if let Some(i) = intro.filter(|i| !i.is_empty()) {
                self.push(&i);
            }
            return;
        }
        let intro = intro.filter(|i| !i.is_empty());
        let lead = intro.clone().unwrap_or_else(|| self.heading.clone());
        let lead = lead.trim_end_matches(':').trim().to_owned();
        let joined = items.join("; ");
        let short = items.len() <= LIST_ITEMS
            && items.iter().all(|i| i.split_whitespace().count() <= ITEM_WORDS);
        if short && joined.chars().count() + lead.chars().count() + 2 <= UNIT_MAX {
            let text = if lead.is_empty() { joined } else { format!("{lead}: {joined}") };
            self.push(&text);
            return;
        }
        if let Some(i) = intro {
            self.push(&i);
        }
        for item in items {
            let text = if item.split_whitespace().count() < 8 && !self.heading.is_empty() {
                format!("{}: {item}", self.heading)
            } else {
                item
            };
            self.push(&text);
        }
    }

    /// Ends whatever is being read (paragraph or list).
    fn end(&mut self) {
        if self.list.is_empty() && self.intro.is_none() {
            self.end_para();
        } else {
            self.end_list();
        }
    }
}

/// The units of one passage, in order, each with its section heading
/// (`heading`: the one in effect where the text starts).
pub fn units(text: &str, heading: &str) -> Vec<(String, String)> {
    let mut c = Collect { heading: heading.to_owned(), ..Collect::default() };
    let text = uncommented(text);
    let mut lines = text.lines().peekable();
    // Front matter of a markdown file: its `description` is a unit.
    if text.starts_with("---") {
        let mut fm = Vec::new();
        lines.next();
        for l in lines.by_ref() {
            if l.trim() == "---" {
                break;
            }
            fm.push(l);
        }
        for l in fm {
            if let Some(d) = l.strip_prefix("description:") {
                let d = d.trim().trim_matches('"');
                if !d.is_empty() {
                    c.push(&clean(d));
                }
            }
        }
    }
    // Whether the line before was blank (a list goes on past a blank line
    // only with another item).
    let mut blank = false;
    while let Some(line) = lines.next() {
        let t = line.trim();
        let in_list = !c.list.is_empty() || c.intro.is_some();
        if t.starts_with("```") || t.starts_with("~~~") {
            c.end();
            blank = false;
            let mut code = Vec::new();
            for l in lines.by_ref() {
                if l.trim().starts_with("```") || l.trim().starts_with("~~~") {
                    break;
                }
                if !l.trim().is_empty() {
                    code.push(l.trim().to_owned());
                }
            }
            if code.is_empty() || code.len() > 6 {
                continue;
            }
            // Code keeps its ticks: it is literal text (and speech drops them).
            let joined = format!("`{}`", code.join("; "));
            // A sentence that introduces the block carries it.
            match c.out.last_mut() {
                Some((prev, _)) if prev.ends_with(':') => {
                    *prev = bound(&format!("{prev} {joined}"), UNIT_MAX);
                }
                _ if code.len() <= 3 => c.push(&joined),
                _ => {}
            }
            continue;
        }
        if t.is_empty() {
            if in_list {
                c.end_item();
            } else {
                c.end_para();
            }
            blank = true;
            continue;
        }
        if let Some(h) = t.strip_prefix('#') {
            c.end();
            c.heading = clean(h.trim_start_matches('#').trim());
            blank = false;
            continue;
        }
        if t.starts_with('|') {
            c.end();
            blank = false;
            if t.chars().all(|ch| "|-: ".contains(ch)) {
                continue;
            }
            let cells: Vec<String> =
                t.trim_matches('|').split('|').map(clean).filter(|x| !x.is_empty()).collect();
            if !cells.is_empty() {
                c.push(&cells.join(" | "));
            }
            continue;
        }
        if let Some(rest) = list_item(line) {
            if in_list {
                c.end_item();
            } else {
                c.end_para();
                // The sentence that introduces the list leads it.
                if c.out.last().is_some_and(|(u, h)| u.ends_with(':') && *h == c.heading) {
                    c.intro = c.out.pop().map(|(u, _)| u);
                } else {
                    c.intro = Some(String::new());
                }
            }
            c.para.push_str(rest);
            blank = false;
            continue;
        }
        if in_list && blank {
            // A paragraph after the list ends it.
            c.end_list();
        }
        blank = false;
        c.para.push(' ');
        c.para.push_str(t.trim_start_matches('>'));
    }
    c.end();
    let mut out = c.out;
    out.retain(|(u, _)| u.split_whitespace().count() >= 2 || u.contains('`'));
    out
}

/// BM25 over a set of term lists.
struct Bm25 {
    idf: HashMap<String, f64>,
    avg: f64,
}

impl Bm25 {
    fn new(docs: &[Vec<String>]) -> Bm25 {
        let n = docs.len().max(1) as f64;
        let mut df: HashMap<String, usize> = HashMap::new();
        for d in docs {
            for t in d.iter().collect::<HashSet<_>>() {
                *df.entry(t.clone()).or_default() += 1;
            }
        }
        let idf = df
            .into_iter()
            .map(|(t, f)| (t, (1.0 + (n - f as f64 + 0.5) / (f as f64 + 0.5)).ln()))
            .collect();
        let avg = docs.iter().map(Vec::len).sum::<usize>() as f64 / n;
        Bm25 { idf, avg: avg.max(1.0) }
    }

    /// The score of `doc` for weighted query terms.
    fn score(&self, query: &[(String, f64)], doc: &[String]) -> f64 {
        // A low k1: a unit is a sentence, where a word said twice says
        // little more than once; which of the question's words it has
        // counts (measured on the research-qa set: k1 0.3 placed the
        // answering sentence in the top three for one more question than
        // the usual 1.2, and for none fewer).
        let (k1, b) = (0.3, 0.75);
        let len = doc.len() as f64;
        query
            .iter()
            .map(|(q, w)| {
                let tf = doc.iter().filter(|t| *t == q).count() as f64;
                if tf == 0.0 {
                    return 0.0;
                }
                let idf = self.idf.get(q).copied().unwrap_or(0.0);
                w * idf * tf * (k1 + 1.0) / (tf + k1 * (1.0 - b + b * len / self.avg))
            })
            .sum()
    }
}

/// Words that name the same thing in software documentation: an
/// abbreviation and its long form, and verbs that docs use for one action.
/// A question's word also finds its group's other words, at [`RELATED`]
/// weight.
const SAME: &[&[&str]] = &[
    &["org", "organization"],
    &["repo", "repository"],
    &["config", "configuration", "settings"],
    &["dir", "directory", "folder"],
    &["pkg", "package"],
    &["env", "environment"],
    &["auth", "authentication"],
    &["admin", "administrator"],
    &["doc", "docs", "documentation"],
    &["app", "application"],
    &["info", "information"],
    &["arg", "argument"],
    &["param", "parameter"],
    &["dep", "dependency"],
    &["remove", "uninstall", "delete"],
    &["store", "keep", "hold", "save"],
    &["pass", "specify", "provide", "supply"],
    &["first", "initial"],
    &["print", "output", "display", "show"],
    &["start", "launch"],
    &["stop", "terminate", "kill"],
    &["error", "failure"],
];

/// The weight of a word found through [`SAME`] or as the end of a
/// compound (`subdirectory` finds `directory`).
const RELATED: f64 = 0.5;

/// The question's terms with weight 1, and the terms of `vocabulary` (the
/// units' words) related to them at [`RELATED`] weight: the same thing
/// named another way ([`SAME`]), or the last part of a compound word of
/// the question (`subdirectory` → `directory`, `subcommand` → `command`).
fn expand(query: &BTreeSet<String>, vocabulary: &HashSet<&String>) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64)> = query.iter().map(|q| (q.clone(), 1.0)).collect();
    let mut add = |t: String| {
        if !query.contains(&t) && !out.iter().any(|(o, _)| *o == t) {
            out.push((t, RELATED));
        }
    };
    for group in SAME {
        let stems: Vec<String> = group.iter().flat_map(|w| terms(w)).collect();
        if stems.iter().any(|s| query.contains(s)) {
            stems.into_iter().for_each(&mut add);
        }
    }
    for q in query {
        for v in vocabulary {
            if v.len() >= 5 && q.len() > v.len() + 1 && q.ends_with(v.as_str()) {
                add((*v).clone());
            }
        }
    }
    out
}

/// What kind of answer a question asks for, by its wording: a number (how
/// many, how long, a default, a limit), something to type (a flag, a
/// command: "how do I"), or a place (where, which file or folder). A unit
/// that has the kind asked for ranks a little higher.
#[derive(Debug, Default, Clone, Copy)]
struct Wants {
    number: bool,
    code: bool,
    place: bool,
}

impl Wants {
    fn of(question: &str) -> Wants {
        let q = question.to_lowercase();
        let w: Vec<&str> =
            q.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).collect();
        let has = |x: &&str| w.contains(x);
        let pair = |a: &str, b: &[&str]| w.windows(2).any(|p| p[0] == a && b.contains(&p[1]));
        Wants {
            number: pair("how", &["many", "much", "long", "big", "large", "old", "often"])
                || ["default", "timeout", "limit", "maximum", "minimum", "size"].iter().any(has),
            code: ["flag", "option", "pass", "command", "type", "print", "output", "display"]
                .iter()
                .any(has)
                || pair("how", &["do", "can", "to"]),
            place: ["where", "folder", "directory", "subdirectory", "path"].iter().any(has)
                || pair("which", &["file"])
                || pair("what", &["file"]),
        }
    }

    /// How many of the wanted kinds `text` has.
    fn met(self, text: &str) -> usize {
        let number = self.number && text.chars().any(|c| c.is_ascii_digit());
        let code = self.code && text.contains('`');
        let file_name = |w: &str| {
            let w = w.trim_matches(|c: char| !c.is_alphanumeric());
            w.rsplit_once('.').is_some_and(|(a, e)| {
                !a.is_empty()
                    && (2..=4).contains(&e.len())
                    && e.chars().all(|c| c.is_ascii_lowercase())
            })
        };
        let place = self.place
            && (text.contains('/') || text.contains('~') || text.split_whitespace().any(file_name));
        usize::from(number) + usize::from(code) + usize::from(place)
    }
}

/// How much the search rank of a unit's passage counts (times 1/2 for the
/// best passage, 1/3 for the second...).
const PRIOR: f64 = 2.0;

/// Every unit of `passages`, scored against `question`, best first (ties
/// keep the passages' order). A unit that appears twice (the same text
/// read twice) is kept once.
pub fn rank(question: &str, passages: &[Passage]) -> Vec<Unit> {
    let query: BTreeSet<String> = terms(question).into_iter().collect();
    let mut all: Vec<Unit> = Vec::new();
    let mut seen = HashSet::new();
    for (pi, p) in passages.iter().enumerate() {
        for (ui, (text, heading)) in units(&p.text, &p.heading).into_iter().enumerate() {
            if seen.insert(text.clone()) {
                all.push(Unit {
                    handle: p.handle.clone(),
                    text,
                    heading,
                    score: 0.0,
                    order: (pi, ui),
                });
            }
        }
    }
    let docs: Vec<Vec<String>> = all.iter().map(|u| terms(&u.text)).collect();
    let heads: Vec<Vec<String>> = all.iter().map(|u| terms(&u.heading)).collect();
    let bm = Bm25::new(&docs);
    let vocabulary: HashSet<&String> = docs.iter().chain(&heads).flatten().collect();
    let weighted = expand(&query, &vocabulary);
    let wants = Wants::of(question);
    for (i, u) in all.iter_mut().enumerate() {
        let p = &passages[u.order.0];
        let title = terms(&p.title);
        // The unit's own words, its section heading and its source's
        // title count alike (a list item under `fetch-timeout` is about
        // the timeout; every unit of `npm-ping` is about ping); the
        // source's search rank says a little about where it stands.
        let own = bm.score(&weighted, &docs[i]);
        let head = bm.score(&weighted, &heads[i]);
        let in_title = bm.score(&weighted, &title);
        let prior = p.rank.map_or(0.0, |r| 1.0 / (r as f64 + 1.0));
        // A unit that shares no topic word with the question (nor does its
        // heading) is not relevant, wherever it stands.
        let kind = wants.met(&u.text) as f64;
        // An answer tells something the question does not: a unit whose
        // every word is the question's own (a title, a synopsis) says
        // little.
        let novel = docs[i].iter().any(|t| !query.contains(t));
        u.score = if own + head > 0.0 {
            let s = own + head + in_title + PRIOR * prior + kind;
            if novel {
                s
            } else {
                0.3 * s
            }
        } else {
            0.0
        };
    }
    all.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.order.cmp(&b.order)));
    all
}

/// The `n` best units that say something (a positive score), best first,
/// each saying something the ones before it did not: a unit that mostly
/// repeats a chosen one (two files telling the same fact in nearly the
/// same words) is passed over, so what is said together never reads as a
/// loop.
pub fn best(question: &str, passages: &[Passage], n: usize) -> Vec<Unit> {
    let mut out: Vec<Unit> = Vec::new();
    let mut said: Vec<HashSet<String>> = Vec::new();
    for u in rank(question, passages).into_iter().filter(|u| u.score > 0.0) {
        if out.len() == n {
            break;
        }
        let t: HashSet<String> = terms(&u.text).into_iter().collect();
        let repeats = said.iter().any(|s| {
            let shared = t.intersection(s).count() as f64;
            shared >= REPEATS * t.len() as f64
        });
        let together: Vec<String> =
            out.iter().chain([&u]).map(|o| format!("{} [{}]", o.text, o.handle)).collect();
        if repeats || reads_as_loop(&together.join(" ")) {
            continue;
        }
        said.push(t);
        out.push(u);
    }
    out
}

/// Whether composed text would be taken for a loop: by a reader (phrases
/// of four words) or by the junk watch at any point while it streams
/// (`loops` with the watch's own limits, on every prefix).
fn reads_as_loop(text: &str) -> bool {
    if loops(text, 4, 3, 80) {
        return true;
    }
    text.char_indices()
        .map(|(i, _)| i)
        .chain([text.len()])
        .filter(|&i| i > 0 && text[..i].ends_with(|c: char| !c.is_alphanumeric()))
        .any(|i| loops(&text[..i], WATCH_PHRASE, WATCH_REPEATS, WATCH_TAIL))
}

/// The junk watch's limits (the daemon's `research/junk.rs`): a phrase of
/// this many words...
pub const WATCH_PHRASE: usize = 5;
/// ...said this many times is a loop,
pub const WATCH_REPEATS: usize = 3;
/// and so is a tail this long (characters) written before.
pub const WATCH_TAIL: usize = 80;

/// The share of a unit's topic terms that, found in a chosen unit, makes
/// it a repetition of that one.
const REPEATS: f64 = 0.7;

/// Words of a text, lower-cased, punctuation dropped.
fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// Whether `text` reads as a loop: a sentence of four or more words said
/// twice, a phrase of `phrase` words said `repeats` times, or its last
/// `tail` characters written before (a loop of any shape: code, lists).
/// The junk watch judges an answer with it as it streams; a composed
/// answer is chosen so that it never holds.
pub fn loops(text: &str, phrase: usize, repeats: usize, tail: usize) -> bool {
    let mut said = HashSet::new();
    for s in text.split(['.', '!', '?', '\n']) {
        let w = words(s);
        if w.len() >= 4 && !said.insert(w.join(" ")) {
            return true;
        }
    }
    let w = words(text);
    let mut counts: HashMap<&[String], usize> = HashMap::new();
    for g in w.windows(phrase.max(1)) {
        let c = counts.entry(g).or_default();
        *c += 1;
        if *c >= repeats {
            return true;
        }
    }
    let chars: Vec<char> = text.chars().collect();
    if tail > 0 && chars.len() >= 2 * tail {
        let end: String = chars[chars.len() - tail..].iter().collect();
        let head: String = chars[..chars.len() - tail].iter().collect();
        if end.trim().len() >= tail / 2 && head.contains(&end) {
            return true;
        }
    }
    false
}

/// How much of a text's topic (its [`terms`]) the evidence and question
/// share: the fraction of the terms that occur in them (1.0 for a text
/// with no topic terms).
pub fn overlap(terms: &[String], evidence: &HashSet<String>) -> f64 {
    if terms.is_empty() {
        return 1.0;
    }
    terms.iter().filter(|w| evidence.contains(*w)).count() as f64 / terms.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_are_sentences_items_and_introduced_code() {
        let text = "---\ntitle: npm-ping\ndescription: Ping npm registry\n---\n\n### Description\n\nPing the configured registry. If it works it will output something like:\n\n```bash\nnpm notice PONG 255ms\n```\n\n#### `fetch-timeout`\n\n* Default: 300000 (5 minutes)\n* Type: Number\n\nSee [the docs](/x) for more, e.g. this. Next one.\n";
        let u = units(text, "");
        let texts: Vec<&str> = u.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(
            texts,
            vec![
                "Ping npm registry",
                "Ping the configured registry.",
                "If it works it will output something like: `npm notice PONG 255ms`",
                "`fetch-timeout`: Default: 300000 (5 minutes); Type: Number",
                "See the docs for more, e.g. this.",
                "Next one.",
            ]
        );
        assert_eq!(u[3].1, "`fetch-timeout`");
        // A short list is one unit, led by the sentence that introduces it;
        // a long item stands alone.
        let list = "## Roles\n\nThere are three levels:\n\n1. Owner, pays.\n2. Admin, manages teams.\n\nAfter the list.\n\n* one item that is long enough to say something on its own without help from anything\n* two\n";
        let texts: Vec<String> = units(list, "").into_iter().map(|(t, _)| t).collect();
        assert_eq!(
            texts,
            vec![
                "There are three levels: Owner, pays.; Admin, manages teams.",
                "After the list.",
                "one item that is long enough to say something on its own without help from anything",
                "Roles: two",
            ]
        );
    }

    #[test]
    fn links_and_comments_are_reduced_to_what_is_read() {
        assert_eq!(
            clean("Use [`clearTimeout()`][] or [the docs](/x) or [a][b], [not a link]."),
            "Use `clearTimeout()` or the docs or a, [not a link]."
        );
        let u = units("<!-- YAML\nadded: v0.1\n-->\n\nThe delay is 1. <!-- x --> Then more.\n", "");
        let texts: Vec<&str> = u.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(texts, ["The delay is 1.", "Then more."]);
        assert_eq!(uncommented("a <!-- open"), "a ");
    }

    #[test]
    fn a_segment_that_continues_a_section_keeps_its_heading() {
        let u =
            units("If it is not set, it defaults to `index.js`.\n\n## type\n\nThe type.\n", "main");
        assert_eq!(u[0].1, "main");
        assert_eq!(u[1].1, "type");
    }

    /// A passage found by a search, at place `rank`.
    fn passage(handle: &str, title: &str, text: &str, rank: usize) -> Passage {
        Passage {
            handle: handle.into(),
            title: title.into(),
            text: text.into(),
            heading: String::new(),
            rank: Some(rank),
        }
    }

    #[test]
    fn the_unit_that_answers_ranks_first() {
        let p = |h: &str, t: &str, r| passage(h, "t", t, r);
        let ps = vec![
            p("S1", "The cache holds packages. Unrelated words about teams and orgs.", 1),
            p("S2", "## Timeout\n\nRequests time out after 300000 ms. Other text here.", 2),
        ];
        let b = best("What is the default timeout of requests?", &ps, 2);
        assert_eq!(b[0].handle, "S2");
        assert!(b[0].text.contains("300000"), "{b:?}");
        assert!(best("zebra quantum", &ps, 3).is_empty(), "nothing relevant, nothing chosen");
    }

    #[test]
    fn what_is_said_together_repeats_nothing() {
        let p = |h: &str, t: &str, r| passage(h, "audit", t, r);
        let ps = vec![
            p("S1", "If the registry answers with an error, npm loads audit data from the Quick Audit endpoint. There are two audit endpoints: the Bulk endpoint and the Quick Audit endpoint.", 1),
            p("S2", "If the Bulk endpoint answers with an error or bad data, npm loads audit data from the Quick Audit endpoint, which is slower.", 2),
        ];
        let b =
            best("Where does npm audit get data when the endpoint answers with an error?", &ps, 3);
        assert_eq!(b.len(), 2, "the near repeat is passed over: {b:?}");
        let said: Vec<&str> = b.iter().map(|u| u.text.as_str()).collect();
        assert!(!loops(&said.join(" "), 4, 3, 80));
        assert!(loops("a b c d. and a b c d, and a b c d", 4, 3, 80));
        // Two examples that share their code would say a call four times
        // together: the second is passed over.
        let code = "```\n> process.on('foo', () => {});\n> process.on('foo', () => {});\n```\n";
        let ps = [
            p("S1", &format!("Too many listeners print a warning:\n\n{code}"), 1),
            p("S2", &format!("With no warnings, listeners print nothing:\n\n{code}"), 2),
        ];
        let b = best("How many listeners print a warning?", &ps, 3);
        assert_eq!(b.len(), 1, "{b:?}");
    }

    #[test]
    fn overlap_tells_evidence_from_drift() {
        let ev: HashSet<String> =
            terms("The round limit ends research with a final turn").into_iter().collect();
        let of = |t: &str| overlap(&terms(t), &ev);
        assert!(of("At the round limit research ends and a final turn answers") > 0.8);
        assert!(of("Python functions taking too many arguments are a code smell") < 0.2);
    }

    proptest::proptest! {
        /// Any passage text (a corpus file is arbitrary input) is cut and
        /// ranked without a panic, each unit on one line and bounded.
        #[test]
        fn any_text_is_cut_and_ranked_without_panic(
            text in "(\\PC|[\\n#*`|\\[\\]()>:. -]){0,600}",
            q in "\\PC{0,60}",
        ) {
            let ps = [passage("S1", "t", &text, 1)];
            for u in rank(&q, &ps) {
                proptest::prop_assert!(!u.text.contains('\n'));
                proptest::prop_assert!(u.text.chars().count() <= UNIT_MAX + 1);
            }
        }
    }
}
