//! A simulated system's BIOS settings, as real BMCs keep them: the
//! `Bios` resource lists the attributes in effect, its
//! `@Redfish.Settings` names the settings object; a PATCH to that object
//! (with the apply time `OnReset`, the only one offered) is pending until
//! the system restarts, and an attribute or a value the BMC does not know
//! is refused, named.

use actix_web::{HttpRequest, HttpResponse, web};
use serde_json::{Map, Value, json};

use super::{State, error, machine};

/// The attributes and the values each may take (the first: its default).
pub const ATTRIBUTES: &[(&str, &[&str])] = &[
    ("BootMode", &["Uefi", "Bios"]),
    ("ProcVirtualization", &["Disabled", "Enabled"]),
    ("SriovGlobalEnable", &["Disabled", "Enabled"]),
    ("ProcTurboMode", &["Enabled", "Disabled"]),
    ("SerialComm", &["OnConRedirCom1", "Off"]),
];

/// The registry that names them.
pub const REGISTRY: &str = "SimBiosAttributeRegistry.v1_0_0";

/// A system's BIOS settings: in effect, and pending until a reset.
pub(super) struct Bios {
    pub current: Map<String, Value>,
    pub pending: Map<String, Value>,
}

impl Default for Bios {
    fn default() -> Self {
        Bios {
            current: ATTRIBUTES
                .iter()
                .map(|(k, v)| (k.to_string(), Value::from(v[0])))
                .collect(),
            pending: Map::new(),
        }
    }
}

impl Bios {
    /// A reset: the pending settings take effect.
    pub fn apply(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        self.current.extend(pending);
    }
}

pub(super) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/redfish/v1/Systems/1/Bios", web::get().to(bios))
        .route(
            "/redfish/v1/Systems/1/Bios/Settings",
            web::get().to(settings),
        )
        .route(
            "/redfish/v1/Systems/1/Bios/Settings",
            web::patch().to(patch_settings),
        );
}

async fn bios(req: HttpRequest, st: web::Data<State>) -> HttpResponse {
    authorize!(req, st);
    let current = st.with_system(machine(&req), |s| s.bios.current.clone());
    HttpResponse::Ok().json(json!({
        "@odata.id": "/redfish/v1/Systems/1/Bios",
        "Id": "Bios",
        "AttributeRegistry": REGISTRY,
        "Attributes": current,
        "@Redfish.Settings": {
            "@odata.type": "#Settings.v1_3_5.Settings",
            "SettingsObject": {"@odata.id": "/redfish/v1/Systems/1/Bios/Settings"},
            "SupportedApplyTimes": ["OnReset"],
        },
    }))
}

async fn settings(req: HttpRequest, st: web::Data<State>) -> HttpResponse {
    authorize!(req, st);
    let pending = st.with_system(machine(&req), |s| s.bios.pending.clone());
    HttpResponse::Ok().json(json!({
        "@odata.id": "/redfish/v1/Systems/1/Bios/Settings",
        "Id": "Settings",
        "Attributes": pending,
    }))
}

async fn patch_settings(
    req: HttpRequest,
    st: web::Data<State>,
    body: web::Json<Value>,
) -> HttpResponse {
    authorize!(req, st);
    let apply = body["@Redfish.SettingsApplyTime"]["ApplyTime"]
        .as_str()
        .unwrap_or("OnReset");
    if apply != "OnReset" {
        return HttpResponse::BadRequest().json(error(
            "Base.1.0.PropertyValueNotInList",
            &format!("ApplyTime {apply:?} is not supported: OnReset"),
        ));
    }
    let Some(asked) = body["Attributes"].as_object() else {
        return HttpResponse::BadRequest()
            .json(error("Base.1.0.PropertyMissing", "Attributes is required"));
    };
    for (k, v) in asked {
        let Some((_, allowed)) = ATTRIBUTES.iter().find(|(a, _)| a == k) else {
            return HttpResponse::BadRequest().json(error(
                "Base.1.0.PropertyUnknown",
                &format!(
                    "The property {k} is not in the list of valid properties for the resource."
                ),
            ));
        };
        if !v.as_str().is_some_and(|v| allowed.contains(&v)) {
            return HttpResponse::BadRequest().json(error(
                "Base.1.0.PropertyValueNotInList",
                &format!(
                    "The value {v} for the property {k} is not in the list of acceptable values."
                ),
            ));
        }
    }
    st.with_system(machine(&req), |s| {
        s.bios.pending.extend(asked.clone());
    });
    HttpResponse::NoContent().finish()
}
