//! Examples of the language, its refusals and its bounds (the model-based property test is in
//! `model.rs`).

use serde_json::{json, Value};

use crate::expr::{Expr, Operand};
use crate::{Document, Selection, MAX_NESTING, MAX_SELECTION_BYTES};

fn parse(text: &str) -> Result<Expr, crate::Error> {
    crate::parser::parse(text)
}

fn check(condition: &str, fields: Option<Value>, expected: bool) {
    let fields = fields.map(|f| f.as_object().unwrap().clone());
    let subject = Document {
        id: "id:ns:music::1",
        doctype: "music",
        fields: fields.as_ref(),
    };
    let parsed = Selection::parse(condition).unwrap_or_else(|e| panic!("{condition}: {e}"));
    assert_eq!(parsed.matches(&subject), expected, "{condition}");
}

#[test]
fn evaluates_the_subset() {
    let doc = || Some(json!({"year": 2005, "title": "Hello World", "rating": 4.5, "live": true}));
    check("music.year > 2000", doc(), true);
    check(
        "music.year == 2005 and music.title == \"Hello World\"",
        doc(),
        true,
    );
    check("music.year < 2000 or music.rating >= 4.5", doc(), true);
    check("NOT (music.year <= 2005)", doc(), false);
    check("music.title = 'Hello*'", doc(), true);
    check("music.title = 'H?llo W*d'", doc(), true);
    check("music.title = 'Bye*'", doc(), false);
    check("music.missing", doc(), false);
    check("music.missing == null", doc(), true);
    check("music.title != 'x'", doc(), true);
    check("music.live", doc(), true);
    check("music", doc(), true);
    check("books", doc(), false);
    check("books.year > 1", doc(), false);
    check("id == 'id:ns:music::1'", doc(), true);
    check("music.year > 2000", None, false);
    check("not music", None, true);
    check("music.year > 'text'", doc(), false);
}

#[test]
fn the_extended_language() {
    let doc = || Some(json!({"year": 2005, "title": "Hello World", "n": null}));
    check("music.title =~ '^Hel+o W'", doc(), true);
    check(
        "music.title =~ 'World$' and not music.title =~ '^World'",
        doc(),
        true,
    );
    check("music.year =~ '2005'", doc(), false);
    check("id.namespace == 'ns' and id.type == 'music'", doc(), true);
    check(
        "id.specific == '1' and id.user == null and id.group == null",
        doc(),
        true,
    );
    check("id = 'id:ns:*'", doc(), true);
    check("music.n == null and music.absent == NULL", doc(), true);
    check("music.year >= -1 and music.year < 2e3", doc(), false);
    check("(music.year == 2005 or false) and (true)", doc(), true);
    check("music and not books", doc(), true);
    let grouped = |id: &str| {
        let fields = json!({}).as_object().unwrap().clone();
        let doc = Document {
            id,
            doctype: "music",
            fields: Some(&fields),
        };
        let parsed = Selection::parse("id.user == 42 or id.group = 'us*'").unwrap();
        parsed.matches(&doc)
    };
    assert!(grouped("id:ns:music:n=42:a"));
    assert!(grouped("id:ns:music:g=users:a"));
    assert!(!grouped("id:ns:music:n=41:a"));
    assert!(!grouped("id:ns:music::42"));
}

#[test]
fn errors_carry_the_byte_position() {
    for (bad, position) in [
        ("music.year >", 12),
        ("music.year > 1 )", 15),
        ("(music.year > 1", 15),
        ("music.year ==== 1", 13),
        ("é.x == 'unterminated", 8),
        ("music.title =~ '(a'", 15),
        ("music.title =~ music.x", 15),
        ("id.bucket == 1", 0),
        ("music.a.b == 1", 0),
        ("music.x == 1 and", 16),
        ("music.x and or music.y", 12),
        ("now() > 1", 3),
    ] {
        let err = Selection::parse(bad).unwrap_err();
        assert_eq!(err.position(), position, "{bad}: {err}");
        assert!(
            err.to_string().ends_with(&format!("at byte {position}")),
            "{err}"
        );
    }
    let too_many = vec!["music.x =~ 'a'"; crate::MAX_REGEXES + 1].join(" or ");
    let err = Selection::parse(&too_many).unwrap_err();
    assert!(err.message().contains("at most"), "{err}");
}

#[test]
fn selections_are_shared_across_threads() {
    fn send_sync<T: Send + Sync + 'static>() {}
    send_sync::<Selection>();
    send_sync::<crate::Error>();
}

#[test]
fn refuses_what_it_does_not_know() {
    for bad in [
        "",
        "music.year >",
        "(music.year > 1",
        "music.a.b == 1",
        "music.year + 1 > 2",
        "'unterminated",
        "music.year > 1 )",
        "now() > 1",
        "music.title = music.other",
        "music.title = 3",
        "music.title =~ 3",
        "music.x == and",
        "id.user.x == 1",
    ] {
        assert!(parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn nesting_is_bounded_and_long_chains_stay_flat() {
    let nested = |n: usize| format!("{}music.x{}", "(".repeat(n), ")".repeat(n));
    assert!(parse(&nested(MAX_NESTING)).is_ok());
    let err = parse(&nested(MAX_NESTING + 1)).unwrap_err();
    assert!(err.message().contains("nests deeper"), "{err}");
    assert!(parse(&nested(100_000)).is_err());
    assert!(parse(&format!("{}music", "not ".repeat(MAX_NESTING))).is_ok());
    assert!(parse(&format!("{}music", "not ".repeat(MAX_NESTING + 1))).is_err());
    assert!(parse(&format!("{}music", "not ".repeat(100_000))).is_err());
    // 1,000 `and`s: one flat list, evaluated and dropped without deep recursion.
    let chain = vec!["music.x"; 1_000].join(" and ");
    match parse(&chain).unwrap() {
        Expr::And(all) => assert_eq!(all.len(), 1_000),
        other => panic!("not flat: {other:?}"),
    }
    assert!(parse(&"music.x or ".repeat(2_000)).is_err(), "too long");
}

/// How deep a parsed condition nests: what bounds evaluation's and drop's recursion.
fn depth(condition: &Expr) -> usize {
    let operand = |o: &Operand| match o {
        Operand::Group(inner) => 1 + depth(inner),
        _ => 0,
    };
    match condition {
        Expr::Or(all) | Expr::And(all) => all.iter().map(depth).max().unwrap_or(0),
        Expr::Not(inner) => 1 + depth(inner),
        Expr::Compare(a, _, b) => operand(a).max(operand(b)),
        Expr::Glob(a, _) | Expr::Regex(a, _) | Expr::Truthy(a) => operand(a),
    }
}

proptest::proptest! {
    #[test]
    fn never_panics_never_nests_past_the_limit(
        text in "([()]|not |and |or |music\\.x|music| == | = |'a\\*'|1| ){0,400}"
    ) {
        if let Ok(condition) = parse(&text) {
            proptest::prop_assert!(depth(&condition) <= MAX_NESTING);
            let fields = json!({"x": "abc"}).as_object().unwrap().clone();
            let subject = Document { id: "id:ns:music::1", doctype: "music", fields: Some(&fields) };
            let _ = condition.matches(&subject);
        }
    }

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
        let _ = parse(&text);
    }
}

#[test]
fn parsing_time_grows_linearly() {
    // The longest condition accepted, of the worst shapes: parsing must not take longer than
    // a small multiple of a condition a sixteenth its size (a generous linearity check).
    for unit in [
        "(",
        "not ",
        "music.x and ",
        "'a*' = 'b?' or ",
        r#""\\"#,
        "-1 ",
    ] {
        // The fastest of a few runs: other tests share the cores.
        let timed = |bytes: usize| {
            let text = unit.repeat(bytes / unit.len());
            (0..5)
                .map(|_| {
                    let started = std::time::Instant::now();
                    let _ = parse(&text);
                    started.elapsed()
                })
                .min()
                .expect("five runs")
        };
        let (small, large) = (timed(MAX_SELECTION_BYTES / 16), timed(MAX_SELECTION_BYTES));
        assert!(
            large < small * 64 + std::time::Duration::from_millis(100),
            "{unit:?}: {small:?} then {large:?}"
        );
    }
}
