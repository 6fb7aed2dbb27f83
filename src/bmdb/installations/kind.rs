//! What a `machine_installation` generation is: an installation of an
//! operating system, or an erasure. The column (`kind`, V14) holds the
//! same words, and its check constraint only these (written as
//! [`Kind::as_str`], read back as a `Kind`).

use std::fmt;

use postgres_types::{FromSql, Type};

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// An operating system written to the machine's disk.
    Install,
    /// The machine's disks erased (a deprovisioning).
    Erase,
}

impl Kind {
    pub const ALL: [Kind; 2] = [Kind::Install, Kind::Erase];

    /// The word the BMDB keeps, and the API shows.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Install => "install",
            Kind::Erase => "erase",
        }
    }

    /// The noun for people: "installation" or "erasure".
    pub fn noun(self) -> &'static str {
        match self {
            Kind::Install => "installation",
            Kind::Erase => "erasure",
        }
    }

    /// The work under way: "installing" or "erasing".
    pub fn doing(self) -> &'static str {
        match self {
            Kind::Install => "installing",
            Kind::Erase => "erasing",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Kind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Kind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| format!("{s:?} is not an installation kind (install or erase)"))
    }
}

impl<'a> FromSql<'a> for Kind {
    fn from_sql(
        ty: &Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(<&str as FromSql>::from_sql(ty, raw)?.parse::<Kind>()?)
    }

    fn accepts(ty: &Type) -> bool {
        <&str as FromSql>::accepts(ty)
    }
}
