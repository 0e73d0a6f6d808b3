use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderValue, Uri};
use proptest::prelude::*;

use super::*;

const V4: &str = "AWS4-HMAC-SHA256 Credential=K/20261128/us-east-1/s3/aws4_request, \
                  SignedHeaders=host;x-amz-date, Signature=00";

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.insert(*name, HeaderValue::from_str(value).unwrap());
    }
    map
}

/// SigV4's basic format of a time, made from httpdate's IMF-fixdate of it.
fn amz_date(time: SystemTime) -> String {
    let text = httpdate::fmt_http_date(time); // "Sun, 06 Nov 1994 08:49:37 GMT"
    let f: Vec<&str> = text.split([' ', ':']).collect();
    let months = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month = months.iter().position(|m| *m == f[2]).unwrap() + 1;
    format!("{}{month:02}{}T{}{}{}Z", f[3], f[1], f[4], f[5], f[6])
}

#[test]
fn amz_dates_read_as_unix_seconds() {
    assert_eq!(amz_date_seconds("19700101T000000Z"), Some(0));
    assert_eq!(amz_date_seconds("20130524T000000Z"), Some(1_369_353_600));
    assert_eq!(amz_date_seconds("19691231T235959Z"), Some(-1));
    assert_eq!(amz_date_seconds("20000229T120000Z"), Some(951_825_600));
    for bad in [
        "20010229T000000Z", // not a leap year
        "20131301T000000Z",
        "20130500T000000Z",
        "20130524T240000Z",
        "20130524T006000Z",
        "2013-05-24T00:00Z",
        "20130524T000000",
        "20130524T000000ZZ",
        "2013052x T00000Z",
        "+0130524T000000Z",
        "",
    ] {
        assert_eq!(amz_date_seconds(bad), None, "{bad}");
    }
}

#[test]
fn requests_without_a_header_signature_are_left_to_s3s() {
    let now = SystemTime::now();
    assert_eq!(check_time(&HeaderMap::new(), now), Ok(()));
    let bearer = headers(&[("authorization", "Bearer x"), ("date", "Bad Date")]);
    assert_eq!(check_time(&bearer, now), Ok(()));
    // A SigV4 request whose x-amz-date s3s will refuse anyway.
    let malformed = headers(&[("authorization", V4), ("x-amz-date", "yesterday")]);
    assert_eq!(check_time(&malformed, now), Ok(()));
}

#[test]
fn a_sigv4_request_is_taken_within_fifteen_minutes_of_now_either_way() {
    let now = SystemTime::now();
    let at = |time| headers(&[("authorization", V4), ("x-amz-date", &amz_date(time))]);
    let minutes = |m: u64| Duration::from_secs(m * 60);
    assert_eq!(check_time(&at(now), now), Ok(()));
    assert_eq!(check_time(&at(now - minutes(14)), now), Ok(()));
    assert_eq!(check_time(&at(now + minutes(14)), now), Ok(()));
    assert_eq!(
        check_time(&at(now - minutes(16)), now),
        Err(Refusal::Skewed)
    );
    assert_eq!(
        check_time(&at(now + minutes(16)), now),
        Err(Refusal::Skewed)
    );
    let old = headers(&[("authorization", V4), ("x-amz-date", "19500707T215304Z")]);
    assert_eq!(check_time(&old, now), Err(Refusal::Skewed));
}

#[test]
fn a_sigv2_request_needs_a_date_near_now_and_x_amz_date_wins() {
    let now = SystemTime::now();
    let v2 = "AWS KEY:c2lnbmF0dXJl";
    let fresh = httpdate::fmt_http_date(now);
    let stale = "Tue, 07 Jul 2010 21:53:04 GMT";
    let with = |pairs: &[(&'static str, &str)]| {
        let mut all = vec![("authorization", v2)];
        all.extend_from_slice(pairs);
        check_time(&headers(&all), now)
    };
    assert_eq!(with(&[("date", &fresh)]), Ok(()));
    assert_eq!(with(&[("x-amz-date", &fresh), ("date", stale)]), Ok(()));
    assert_eq!(
        with(&[("x-amz-date", stale), ("date", &fresh)]),
        Err(Refusal::Skewed)
    );
    assert_eq!(
        with(&[("date", "Tue, 07 Jul 9999 21:53:04 GMT")]),
        Err(Refusal::Skewed)
    );
    assert_eq!(with(&[]), Err(Refusal::NoDate));
    assert_eq!(with(&[("x-amz-date", "Bad Date")]), Err(Refusal::NoDate));
    assert_eq!(with(&[("x-amz-date", "")]), Err(Refusal::NoDate));
    // Before 1970: not a time httpdate reads, as S3 refuses it (AccessDenied).
    assert_eq!(
        with(&[("x-amz-date", "Tue, 07 Jul 1950 21:53:04 GMT")]),
        Err(Refusal::NoDate)
    );
}

#[test]
fn a_sigv2_bucket_request_gets_its_slash_and_names_the_same_bucket() {
    let v2 = headers(&[("authorization", "AWS KEY:c2ln")]);
    let v4 = headers(&[("authorization", V4)]);
    let none = HeaderMap::new();
    let uri = |s: &str| s.parse::<Uri>().unwrap();
    let rewritten = |h: &HeaderMap, s: &str| v2_bucket_uri(h, &uri(s)).map(|u| u.to_string());
    assert_eq!(rewritten(&v2, "/bucket").as_deref(), Some("/bucket/"));
    assert_eq!(
        rewritten(&v2, "/bucket?acl").as_deref(),
        Some("/bucket/?acl")
    );
    assert_eq!(
        rewritten(&none, "/b?AWSAccessKeyId=K&Expires=1&Signature=S").as_deref(),
        Some("/b/?AWSAccessKeyId=K&Expires=1&Signature=S")
    );
    for (h, s) in [
        (&v2, "/bucket/"),
        (&v2, "/bucket/key"),
        (&v2, "/"),
        (&v4, "/bucket"),
    ] {
        assert_eq!(rewritten(h, s), None, "{s}");
    }
    assert_eq!(rewritten(&none, "/bucket"), None);
    let before = s3s::path::parse_path_style("/bucket").unwrap();
    let after = s3s::path::parse_path_style(uri("/bucket/").path()).unwrap();
    assert_eq!(before, after);
}

proptest! {
    #[test]
    fn every_second_from_1970_to_9999_reads_back(seconds in 0u64..253_402_300_800) {
        let time = UNIX_EPOCH + Duration::from_secs(seconds);
        prop_assert_eq!(amz_date_seconds(&amz_date(time)), Some(seconds as i64));
    }

    #[test]
    fn any_text_reads_as_a_time_or_none_without_panicking(text in "\\PC{0,24}") {
        let _ = amz_date_seconds(&text);
        let _ = http_date_seconds(&text);
    }

    #[test]
    fn http_dates_read_as_their_seconds(seconds in 0u64..253_402_300_800) {
        let time = UNIX_EPOCH + Duration::from_secs(seconds);
        prop_assert_eq!(http_date_seconds(&httpdate::fmt_http_date(time)), Some(seconds as i64));
    }

    #[test]
    fn digits_in_sigv4_shape_read_only_as_real_dates(text in "[0-9]{8}T[0-9]{6}Z") {
        if let Some(seconds) = amz_date_seconds(&text) {
            let time = UNIX_EPOCH.checked_add(Duration::from_secs(seconds.max(0) as u64));
            if seconds >= 0 {
                prop_assert_eq!(amz_date(time.unwrap()), text);
            }
        }
    }
}

#[test]
fn sigv2_is_told_from_sigv4_by_header_and_by_query() {
    let uri = |text: &str| text.parse::<Uri>().unwrap();
    let none = HeaderMap::new();
    let v2 = headers(&[("authorization", "AWS AKID:c2lnbmF0dXJl")]);
    let v4 = headers(&[("authorization", V4)]);
    assert!(is_signature_v2(&v2, &uri("/b/k")));
    assert!(!is_signature_v2(&v4, &uri("/b/k")));
    assert!(!is_signature_v2(&none, &uri("/b/k")), "anonymous");
    assert!(is_signature_v2(
        &none,
        &uri("/b/k?AWSAccessKeyId=AKID&Expires=1&Signature=x")
    ));
    assert!(!is_signature_v2(
        &none,
        &uri("/b/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=00")
    ));
    assert!(!is_signature_v2(
        &none,
        &uri("/b?list-type=2&prefix=Signature")
    ));
    assert_eq!(Refusal::SignatureV2.status(), http::StatusCode::BAD_REQUEST);
    assert_eq!(Refusal::SignatureV2.code_and_message().0, "InvalidRequest");
}
