//! Query parameters of `/document/v1`: `create`, `dryRun`, `timeout`, `condition`, and `route`
//! and `tracelevel` (accepted and ignored: Larder has one route).

use std::time::Duration;

use larder_proto::percent_decode;

#[derive(Debug, Default, PartialEq)]
pub struct Params {
    pub create: bool,
    pub dry_run: bool,
    pub timeout: Option<Duration>,
    pub condition: Option<String>,
}

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
            // Vespa ignores parameters it does not know; so does Larder, to stay compatible
            // with clients that send newer ones.
            _ => {}
        }
    }
    Ok(params)
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
        assert_eq!(parse("").unwrap(), Params::default());
    }
}
