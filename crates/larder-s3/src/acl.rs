//! Canned ACLs, the part of S3's ACLs Larder keeps: a bucket is `private` or `public-read`
//! (anonymous requests may list it and read its objects), and an object may say otherwise for
//! itself (`x-amz-acl` on PutObject, CopyObject or CreateMultipartUpload, or PutObjectAcl
//! later): `public-read` makes
//! one object readable anonymously in a private bucket, `private` keeps one object closed in a
//! public-read bucket. Keys and their per-bucket grants (`auth.rs`) decide everything signed;
//! grants to other accounts, and ACLs that open writes, are not built (501 `NotImplemented`).

use s3s::dto::{BucketCannedACL, Grant, Grantee, ObjectCannedACL, Owner, Permission, Type};

use crate::records::ObjectEntry;

fn not_implemented() -> s3s::S3Error {
    s3s::s3_error!(
        NotImplemented,
        "Larder takes the canned ACLs public-read and private only"
    )
}

/// Whether a bucket is made public-read by its canned ACL; `None` with none given. Grants
/// (`x-amz-grant-*`, an ACL document) and other canned ACLs are not built.
pub fn bucket_public(
    acl: Option<&BucketCannedACL>,
    grants_given: bool,
) -> Result<Option<bool>, s3s::S3Error> {
    if grants_given {
        return Err(not_implemented());
    }
    match acl.map(BucketCannedACL::as_str) {
        None => Ok(None),
        Some(BucketCannedACL::PUBLIC_READ) => Ok(Some(true)),
        Some(BucketCannedACL::PRIVATE) => Ok(Some(false)),
        Some(_) => Err(not_implemented()),
    }
}

/// An object's own say on anonymous reads, from its canned ACL: `None` leaves it to the bucket.
/// The `bucket-owner-*` ACLs change nothing here (a bucket has one owner, who has every right).
pub fn object_public(
    acl: Option<&ObjectCannedACL>,
    grants_given: bool,
) -> Result<Option<bool>, s3s::S3Error> {
    if grants_given {
        return Err(not_implemented());
    }
    match acl.map(ObjectCannedACL::as_str) {
        None
        | Some(ObjectCannedACL::BUCKET_OWNER_FULL_CONTROL)
        | Some(ObjectCannedACL::BUCKET_OWNER_READ) => Ok(None),
        Some(ObjectCannedACL::PUBLIC_READ) => Ok(Some(true)),
        Some(ObjectCannedACL::PRIVATE) => Ok(Some(false)),
        Some(_) => Err(not_implemented()),
    }
}

/// Whether anyone may read `entry` in a bucket that is (or is not) `bucket_public`.
pub fn readable_anonymously(entry: &ObjectEntry, bucket_public: bool) -> bool {
    entry.public_read.unwrap_or(bucket_public)
}

/// S3's group of every requester, signed or not.
const ALL_USERS: &str = "http://acs.amazonaws.com/groups/global/AllUsers";

/// The grants a canned ACL stands for (GetBucketAcl, GetObjectAcl): the owner's
/// `FULL_CONTROL`, and with `public`, everyone's `READ`.
pub fn grants(owner: &Owner, public: bool) -> Vec<Grant> {
    let owner_grant = Grant {
        grantee: Some(Grantee {
            display_name: owner.display_name.clone(),
            email_address: None,
            id: owner.id.clone(),
            type_: Type::from_static(Type::CANONICAL_USER),
            uri: None,
        }),
        permission: Some(Permission::from_static(Permission::FULL_CONTROL)),
    };
    let everyone = Grant {
        grantee: Some(Grantee {
            display_name: None,
            email_address: None,
            id: None,
            type_: Type::from_static(Type::GROUP),
            uri: Some(ALL_USERS.into()),
        }),
        permission: Some(Permission::from_static(Permission::READ)),
    };
    match public {
        true => vec![owner_grant, everyone],
        false => vec![owner_grant],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_private_and_public_read_are_taken() {
        let bucket = |s: &'static str| bucket_public(Some(&BucketCannedACL::from_static(s)), false);
        assert_eq!(bucket("public-read").unwrap(), Some(true));
        assert_eq!(bucket("private").unwrap(), Some(false));
        assert!(bucket("public-read-write").is_err());
        assert!(bucket("authenticated-read").is_err());
        assert_eq!(bucket_public(None, false).unwrap(), None);
        assert!(bucket_public(None, true).is_err());
        let object = |s: &'static str| object_public(Some(&ObjectCannedACL::from_static(s)), false);
        assert_eq!(object("public-read").unwrap(), Some(true));
        assert_eq!(object("private").unwrap(), Some(false));
        assert_eq!(object("bucket-owner-full-control").unwrap(), None);
        assert!(object("public-read-write").is_err());
        assert!(object_public(None, true).is_err());
    }

    #[test]
    fn an_object_says_for_itself_or_leaves_it_to_its_bucket() {
        let mut entry = ObjectEntry::default();
        assert!(readable_anonymously(&entry, true));
        assert!(!readable_anonymously(&entry, false));
        entry.public_read = Some(false);
        assert!(!readable_anonymously(&entry, true));
        entry.public_read = Some(true);
        assert!(readable_anonymously(&entry, false));
    }
}
