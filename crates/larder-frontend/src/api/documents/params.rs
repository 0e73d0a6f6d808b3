//! Query parameters of `/document/v1`: `create`, `dryRun`, `timeout`, `condition`, and `route`
//! and `tracelevel` (accepted and ignored: Larder has one route); for visiting, `selection`,
//! `continuation`, `wantedDocumentCount`, `concurrency`, `fieldSet`, `slices`, `sliceId`,
//! `stream`, `timeChunk`, `cluster` and `bucketSpace` (Larder has one content cluster, and
//! every document is in the `default` bucket space).

use std::time::Duration;

use larder_proto::percent_decode;

#[derive(Debug, Default, PartialEq)]
pub struct Params {
    pub create: bool,
    pub dry_run: bool,
    pub timeout: Option<Duration>,
    pub condition: Option<String>,
    pub selection: Option<String>,
    pub continuation: Option<String>,
    pub wanted_document_count: Option<u64>,
    pub concurrency: Option<u32>,
    pub field_set: Option<String>,
    pub slices: Option<u32>,
    pub slice_id: Option<u32>,
    pub stream: bool,
    pub time_chunk: Option<Duration>,
    pub cluster: Option<String>,
    pub bucket_space: Option<String>,
}

/// Most slices a visit may be split into.
pub const MAX_SLICES: u32 = 1 << 16;

pub fn parse(query: &str) -> Result<Params, String> {
    let mut params = Params::default();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, raw) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_decode(raw, true)
            .ok_or_else(|| format!("malformed percent-encoding in query parameter {name}"))?;
        match name {
            "create" => params.create = boolean(name, &value)?,
            "dryRun" => params.dry_run = boolean(name, &value)?,
            "timeout" => params.timeout = Some(timeout(&value)?),
            "condition" if !value.trim().is_empty() => params.condition = Some(value),
            "condition" | "route" | "tracelevel" => {}
            "selection" if !value.trim().is_empty() => params.selection = Some(value),
            "continuation" if !value.is_empty() => params.continuation = Some(value),
            "wantedDocumentCount" => params.wanted_document_count = Some(positive(name, &value)?),
            "concurrency" => params.concurrency = Some(positive(name, &value)?.min(100) as u32),
            "fieldSet" if !value.is_empty() => params.field_set = Some(value),
            "slices" => {
                params.slices = Some(positive(name, &value)?.min(u64::from(MAX_SLICES)) as u32)
            }
            "sliceId" => {
                let id: u32 = value.parse().map_err(|_| {
                    format!("sliceId must be a non-negative integer, not {value:?}")
                })?;
                params.slice_id = Some(id);
            }
            "stream" => params.stream = boolean(name, &value)?,
            "timeChunk" => params.time_chunk = Some(timeout(&value)?),
            "cluster" if !value.is_empty() => params.cluster = Some(value),
            "bucketSpace" if !value.is_empty() => params.bucket_space = Some(value),
            // Vespa ignores parameters it does not know; so does Larder, to stay compatible
            // with clients that send newer ones.
            _ => {}
        }
    }
    Ok(params)
}

fn positive(name: &str, value: &str) -> Result<u64, String> {
    value
        .parse::<u64>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{name} must be a positive integer, not {value:?}"))
}

fn boolean(name: &str, value: &str) -> Result<bool, String> {
    match value {
        "" | "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!("{name} must be true or false, not {value:?}")),
    }
}

/// Vespa's timeout forms: `899999ms`, `5s`, `1.5s`, `2m`, or bare (fractional) seconds.
pub fn timeout(value: &str) -> Result<Duration, String> {
    let value = value.trim();
    let (number, scale) = if let Some(n) = value.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = value.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = value.strip_suffix('m') {
        (n, 60.0)
    } else {
        (value, 1.0)
    };
    let seconds = number
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|n| n.is_finite() && *n > 0.0)
        .map(|n| n * scale)
        .ok_or_else(|| {
            format!("timeout must be a positive duration such as 5s, 500ms or 2.5, not {value:?}")
        })?;
    Ok(Duration::from_secs_f64(seconds.min(86_400.0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vespa_forms() {
        assert_eq!(timeout("899999ms"), Ok(Duration::from_millis(899_999)));
        assert_eq!(timeout("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(timeout("2.5"), Ok(Duration::from_millis(2500)));
        assert_eq!(timeout("1m"), Ok(Duration::from_secs(60)));
        for bad in ["", "0", "-1s", "abc", "5h"] {
            assert!(timeout(bad).is_err(), "{bad}");
        }
        let p = parse("create=true&dryRun=true&timeout=29995ms&route=default&tracelevel=3&condition=music.year%3E2000").unwrap();
        assert!(p.create && p.dry_run);
        assert_eq!(p.timeout, Some(Duration::from_millis(29_995)));
        assert_eq!(p.condition.as_deref(), Some("music.year>2000"));
        assert!(parse("create=maybe").is_err());
        let v = parse("selection=music.year%3E1&wantedDocumentCount=10&slices=4&sliceId=3&stream=true&timeChunk=2s&cluster=c&fieldSet=%5Bid%5D&concurrency=4").unwrap();
        assert_eq!(v.selection.as_deref(), Some("music.year>1"));
        assert_eq!(
            (v.wanted_document_count, v.slices, v.slice_id),
            (Some(10), Some(4), Some(3))
        );
        assert!(v.stream && v.cluster.is_some() && v.field_set.as_deref() == Some("[id]"));
        assert!(parse("slices=0").is_err() && parse("sliceId=-1").is_err());
        assert_eq!(parse("").unwrap(), Params::default());
    }
}
