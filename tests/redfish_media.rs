//! Booting through Redfish virtual media, against OpenStack's Redfish
//! emulator (sushy-tools, its fake driver) run as a process: the image is
//! inserted (the emulator fetches it from an HTTP server of the test's), the
//! one-time override points at the CD, the system is restarted and seen on;
//! ending the boot ejects and clears the override. And the BMCs an operator
//! meets: one refusing `Inserted`/`WriteProtected` (a proxy in front of the
//! emulator answering as such BMCs do), one answering slowly, a wrong
//! password, a system with no virtual media.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use shepherd::config::RedfishConfig;
use shepherd::redfish::{self, Bmcs};
use shepherd_sim::testing::Sushy;

const PASSWORD: &str = "bmc-pw-51d0aa";

/// A small "boot image" on an HTTP server of the test's own; its URL.
fn serve_iso(name: &str) -> (String, actix_web::dev::ServerHandle) {
    let body: Vec<u8> = (0..64 * 1024u32).map(|i| (i % 253) as u8).collect();
    let server = HttpServer::new(move || {
        let body = body.clone();
        App::new().route(
            "/{name}",
            web::get().to(move || {
                let body = body.clone();
                async move { HttpResponse::Ok().body(body) }
            }),
        )
    })
    .workers(1)
    .disable_signals()
    .bind("127.0.0.1:0")
    .unwrap();
    let addr = server.addrs()[0];
    let server = server.run();
    let handle = server.handle();
    actix_rt::spawn(server);
    (format!("http://{addr}/{name}"), handle)
}

async fn get(sushy: &Sushy, path: &str) -> serde_json::Value {
    let mut r = awc::Client::default()
        .get(format!("{}{path}", sushy.url))
        .basic_auth(&sushy.user, &sushy.password)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{path}: {:?}", r.status());
    r.json().limit(1 << 20).await.unwrap()
}

fn cd_path(i: usize) -> String {
    format!("/redfish/v1/Systems/{}/VirtualMedia/Cd", Sushy::uuid(i))
}

fn config(timeout: Duration) -> RedfishConfig {
    RedfishConfig {
        timeout,
        power_timeout: Duration::from_secs(60),
        ..RedfishConfig::default()
    }
}

#[actix_rt::test]
async fn a_boot_from_virtual_media_inserts_overrides_once_and_restarts_then_ends_clean() {
    let sushy = Sushy::start(&["node-1", "node-2"], "admin", PASSWORD);
    let (url, iso) = serve_iso("boot-1.iso");
    let bmcs = Bmcs::new(&config(Duration::from_secs(20)));
    let boot = redfish::boot_from_media(&bmcs, "node-1", &sushy.bmc(0), &url)
        .await
        .unwrap();
    assert_eq!(boot.media, cd_path(0));
    assert!(!boot.plain_insert, "the emulator takes Inserted");
    assert_eq!(boot.ejected_before, None);
    // The system was on: restarted with the best reset it offers.
    assert_eq!(boot.reset, "ForceRestart");
    let cd = get(&sushy, &cd_path(0)).await;
    assert_eq!(cd["Image"], url.as_str());
    assert_eq!(cd["Inserted"], true);
    assert_eq!(cd["WriteProtected"], true);
    let system = sushy.system(0).await;
    assert_eq!(system["Boot"]["BootSourceOverrideTarget"], "Cd");
    assert_eq!(system["PowerState"], "On", "watched until on");
    // The other system was left alone.
    assert_eq!(get(&sushy, &cd_path(1)).await["Inserted"], false);
    let cd = redfish::virtual_cd(&bmcs, "node-1", &sushy.bmc(0))
        .await
        .unwrap();
    assert!(cd.inserted && cd.image == url, "{cd:?}");

    // A second boot finds the first image in the drive: out first.
    let (url2, iso2) = serve_iso("boot-2.iso");
    let boot = redfish::boot_from_media(&bmcs, "node-1", &sushy.bmc(0), &url2)
        .await
        .unwrap();
    assert_eq!(boot.ejected_before.as_deref(), Some(url.as_str()));
    assert_eq!(get(&sushy, &cd_path(0)).await["Image"], url2.as_str());

    // Ending it: the drive is empty and the next boot is from the disk.
    assert!(
        redfish::end_media_boot(&bmcs, "node-1", &sushy.bmc(0))
            .await
            .unwrap()
    );
    let cd = get(&sushy, &cd_path(0)).await;
    assert_eq!(cd["Inserted"], false);
    assert_eq!(cd["Image"], "");
    assert_eq!(
        sushy.system(0).await["Boot"]["BootSourceOverrideTarget"],
        "Hdd"
    );
    // Ending again finds nothing to eject.
    assert!(
        !redfish::end_media_boot(&bmcs, "node-1", &sushy.bmc(0))
            .await
            .unwrap()
    );
    iso.stop(true).await;
    iso2.stop(true).await;
}

#[actix_rt::test]
async fn an_installed_machine_is_restarted_from_its_disk_with_the_media_out() {
    let sushy = Sushy::start(&["node-1"], "admin", PASSWORD);
    let (url, iso) = serve_iso("boot-1.iso");
    let bmcs = Bmcs::new(&config(Duration::from_secs(20)));
    redfish::boot_from_media(&bmcs, "node-1", &sushy.bmc(0), &url)
        .await
        .unwrap();
    let resets = sushy.log().matches("ComputerSystem.Reset").count();
    // The agent installed the disk: the BMC ejects, clears the override
    // and restarts the system (a power cycle, which BMCs that apply media
    // changes only then need).
    let reset = redfish::boot_from_disk(&bmcs, "node-1", &sushy.bmc(0), true, None)
        .await
        .unwrap();
    assert_eq!(reset, "ForceRestart");
    let cd = get(&sushy, &cd_path(0)).await;
    assert_eq!(cd["Inserted"], false);
    assert_eq!(cd["Image"], "");
    let system = sushy.system(0).await;
    assert_eq!(system["Boot"]["BootSourceOverrideTarget"], "Hdd");
    assert_eq!(system["PowerState"], "On");
    assert_eq!(
        sushy.log().matches("ComputerSystem.Reset").count(),
        resets + 1,
        "one reset: {}",
        sushy.log()
    );
    iso.stop(true).await;
}

/// A BMC in front of the emulator that refuses `Inserted` and
/// `WriteProtected` in `InsertMedia` (as some vendors' do) and answers
/// every request after `delay`; counts the refusals and keeps the bodies
/// of the PATCHes it passed on.
struct Proxy {
    url: String,
    refused: Arc<AtomicUsize>,
    patches: Arc<std::sync::Mutex<Vec<String>>>,
    handle: actix_web::dev::ServerHandle,
}

fn proxy(upstream: &str, refuse_inserted: bool, delay: Duration) -> Proxy {
    proxy_refusing(upstream, refuse_inserted, false, delay)
}

/// [`proxy`], also refusing `UserName`/`Password` in `InsertMedia` (with
/// a message echoing the value, as Redfish's PropertyValueFormatError
/// does) when `refuse_credentials`.
fn proxy_refusing(
    upstream: &str,
    refuse_inserted: bool,
    refuse_credentials: bool,
    delay: Duration,
) -> Proxy {
    let upstream = upstream.to_string();
    let refused = Arc::new(AtomicUsize::new(0));
    let patches = Arc::new(std::sync::Mutex::new(Vec::new()));
    let count = refused.clone();
    let seen = patches.clone();
    let server = HttpServer::new(move || {
        let (upstream, count, seen) = (upstream.clone(), count.clone(), seen.clone());
        App::new().default_service(web::to(move |req: HttpRequest, body: web::Bytes| {
            let (upstream, count, seen) = (upstream.clone(), count.clone(), seen.clone());
            async move {
                tokio::time::sleep(delay).await;
                let text = String::from_utf8_lossy(&body);
                if req.method() == awc::http::Method::PATCH {
                    seen.lock().unwrap().push(text.to_string());
                }
                if refuse_credentials
                    && req.path().ends_with("VirtualMedia.InsertMedia")
                    && text.contains("\"Password\"")
                {
                    count.fetch_add(1, Ordering::SeqCst);
                    let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                    return HttpResponse::BadRequest().json(serde_json::json!({
                        "error": {
                            "code": "Base.1.12.GeneralError",
                            "message": format!("The value '{}' for the property Password is not in the list of acceptable values.", v["Password"].as_str().unwrap_or("")),
                        }
                    }));
                }
                if refuse_inserted
                    && req.path().ends_with("VirtualMedia.InsertMedia")
                    && (text.contains("\"Inserted\"") || text.contains("\"WriteProtected\""))
                {
                    count.fetch_add(1, Ordering::SeqCst);
                    return HttpResponse::BadRequest().json(serde_json::json!({
                        "error": {
                            "code": "Base.1.12.GeneralError",
                            "message": "A general error has occurred.",
                            "@Message.ExtendedInfo": [{
                                "MessageId": "Base.1.12.PropertyUnknown",
                                "Message": "The property Inserted is not in the list of valid properties for the resource."
                            }]
                        }
                    }));
                }
                let mut forward = awc::Client::default().request(
                    req.method().clone(),
                    format!("{upstream}{}", req.uri()),
                );
                for (h, v) in req.headers() {
                    if h != "host" {
                        forward = forward.insert_header((h.clone(), v.clone()));
                    }
                }
                let mut answer = forward.send_body(body).await.unwrap();
                let mut out = HttpResponse::build(answer.status());
                for (h, v) in answer.headers() {
                    if h != "content-length" && h != "transfer-encoding" {
                        out.insert_header((h.clone(), v.clone()));
                    }
                }
                out.body(answer.body().limit(1 << 22).await.unwrap())
            }
        }))
    })
    .workers(1)
    .disable_signals()
    .bind("127.0.0.1:0")
    .unwrap();
    let addr = server.addrs()[0];
    let server = server.run();
    let handle = server.handle();
    actix_rt::spawn(server);
    Proxy {
        url: format!("http://{addr}"),
        refused,
        patches,
        handle,
    }
}

#[actix_rt::test]
async fn a_bmc_refusing_inserted_and_write_protected_gets_the_image_alone() {
    let sushy = Sushy::start(&["node-1"], "admin", PASSWORD);
    let bmc_proxy = proxy(&sushy.url, true, Duration::ZERO);
    let (url, iso) = serve_iso("boot.iso");
    let mut bmc = sushy.bmc(0);
    bmc.url = bmc_proxy.url.clone();
    let bmcs = Bmcs::new(&config(Duration::from_secs(20)));
    let boot = redfish::boot_from_media(&bmcs, "node-1", &bmc, &url)
        .await
        .unwrap();
    assert!(boot.plain_insert);
    assert_eq!(bmc_proxy.refused.load(Ordering::SeqCst), 1);
    // The override asked is for one boot, from the CD (the emulator shows
    // every override as Continuous, so it is read here, on the wire).
    let patches = bmc_proxy.patches.lock().unwrap().clone();
    let overrides: Vec<serde_json::Value> = patches
        .iter()
        .filter_map(|p| serde_json::from_str::<serde_json::Value>(p).ok())
        .filter(|v| v["Boot"].is_object())
        .collect();
    assert_eq!(overrides.len(), 1, "{patches:?}");
    assert_eq!(overrides[0]["Boot"]["BootSourceOverrideTarget"], "Cd");
    assert_eq!(overrides[0]["Boot"]["BootSourceOverrideEnabled"], "Once");
    let cd = get(&sushy, &cd_path(0)).await;
    assert_eq!(cd["Image"], url.as_str());
    assert_eq!(cd["Inserted"], true, "the emulator's default");
    bmc_proxy.handle.stop(true).await;
    iso.stop(true).await;
}

#[actix_rt::test]
async fn a_slow_bmc_is_waited_for_within_the_timeout_and_named_beyond_it() {
    let sushy = Sushy::start(&["node-1"], "admin", PASSWORD);
    let slow = proxy(&sushy.url, false, Duration::from_millis(700));
    let (url, iso) = serve_iso("boot.iso");
    let mut bmc = sushy.bmc(0);
    bmc.url = slow.url.clone();
    // Within the request timeout: slow, but done.
    let patient = Bmcs::new(&config(Duration::from_secs(5)));
    let boot = redfish::boot_from_media(&patient, "node-1", &bmc, &url)
        .await
        .unwrap();
    assert_eq!(get(&sushy, &cd_path(0)).await["Image"], url.as_str());
    assert_eq!(boot.reset, "ForceRestart");
    // Beyond it: a readable error naming the host and the BMC.
    let impatient = Bmcs::new(&config(Duration::from_millis(300)));
    let e = redfish::boot_from_media(&impatient, "node-1", &bmc, &url)
        .await
        .unwrap_err();
    let text = e.to_string();
    assert!(text.contains("host node-1"), "{text}");
    assert!(text.contains(&slow.url), "{text}");
    assert!(e.kind.is_transient(), "{text}");
    slow.handle.stop(true).await;
    iso.stop(true).await;
}

#[actix_rt::test]
async fn a_wrong_password_inserts_nothing_and_never_shows_the_password() {
    let sushy = Sushy::start(&["node-1"], "admin", PASSWORD);
    let (url, iso) = serve_iso("boot.iso");
    let mut bmc = sushy.bmc(0);
    bmc.password = shepherd::secret::Secret::inline("wrong-pw-3b7e90");
    let bmcs = Bmcs::new(&config(Duration::from_secs(20)));
    let e = redfish::boot_from_media(&bmcs, "node-1", &bmc, &url)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("host node-1") && e.contains("401"), "{e}");
    assert!(
        !e.contains("wrong-pw-3b7e90") && !e.contains(PASSWORD),
        "{e}"
    );
    assert_eq!(get(&sushy, &cd_path(0)).await["Inserted"], false);
    iso.stop(true).await;
}

#[actix_rt::test]
async fn a_system_without_virtual_media_says_so() {
    // The emulator's smallest feature set has no virtual media.
    let sushy = Sushy::start_with(
        &["node-1"],
        "admin",
        PASSWORD,
        "SUSHY_EMULATOR_FEATURE_SET = 'minimum'",
    );
    let (url, iso) = serve_iso("boot.iso");
    let bmcs = Bmcs::new(&config(Duration::from_secs(20)));
    let e = redfish::boot_from_media(&bmcs, "node-1", &sushy.bmc(0), &url)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("host node-1"), "{e}");
    assert!(
        e.contains("virtual media") || e.contains("virtual CD"),
        "{e}"
    );
    // And nothing was reset.
    assert!(
        !sushy.log().contains("ComputerSystem.Reset"),
        "{}",
        sushy.log()
    );
    iso.stop(true).await;
}

/// A "boot image" that is served only with `user:password` (HTTP basic);
/// the Authorization headers it was sent.
fn serve_iso_with_auth(
    user: &str,
    password: &str,
) -> (
    String,
    Arc<std::sync::Mutex<Vec<String>>>,
    actix_web::dev::ServerHandle,
) {
    use base64::Engine as _;
    let want = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    );
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let server = HttpServer::new(move || {
        let (want, log) = (want.clone(), log.clone());
        App::new().default_service(web::to(move |req: HttpRequest| {
            let (want, log) = (want.clone(), log.clone());
            async move {
                let given = req
                    .headers()
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                log.lock().unwrap().push(given.clone());
                if given != want {
                    return HttpResponse::Unauthorized()
                        .insert_header(("WWW-Authenticate", "Basic realm=\"boot\""))
                        .finish();
                }
                HttpResponse::Ok().body(vec![7u8; 32 * 1024])
            }
        }))
    })
    .workers(1)
    .disable_signals()
    .bind("127.0.0.1:0")
    .unwrap();
    let addr = server.addrs()[0];
    let server = server.run();
    let handle = server.handle();
    actix_rt::spawn(server);
    (format!("http://{addr}/boot.iso"), seen, handle)
}

#[actix_rt::test]
async fn the_bmc_fetches_the_image_with_the_boot_s_user_name_and_password() {
    let sushy = Sushy::start(&["node-1"], "admin", PASSWORD);
    let (user, password) = shepherd::bmdb::boot::media_credentials(&[9u8; 32]);
    let (url, seen, iso) = serve_iso_with_auth(&user, &password);
    let bmcs = Bmcs::new(&config(Duration::from_secs(20)));
    // Without them the emulator's fetch is refused, and so the insert.
    assert!(
        redfish::boot_from_media(&bmcs, "node-1", &sushy.bmc(0), &url)
            .await
            .is_err()
    );
    let boot = redfish::boot_from_media_with(
        &bmcs,
        "node-1",
        &sushy.bmc(0),
        &url,
        Some((user.clone(), password.clone())),
    )
    .await
    .unwrap();
    assert_eq!(boot.media, cd_path(0));
    let cd = get(&sushy, &cd_path(0)).await;
    assert_eq!(cd["Inserted"], true);
    assert_eq!(cd["UserName"], user.as_str());
    assert!(
        seen.lock().unwrap().iter().any(|h| h.starts_with("Basic ")),
        "the emulator fetched with the credentials"
    );
    iso.stop(true).await;

    // A BMC that refuses them: said so (for the caller to ask again
    // without), and its echo of the password is not repeated.
    let refusing = proxy_refusing(&sushy.url, false, true, Duration::ZERO);
    let mut bmc = sushy.bmc(0);
    bmc.url = refusing.url.clone();
    let (url, _, iso) = serve_iso_with_auth(&user, &password);
    let e = redfish::boot_from_media_with(
        &Bmcs::new(&config(Duration::from_secs(20))),
        "node-1",
        &bmc,
        &url,
        Some((user.clone(), password.clone())),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(e.kind, shepherd::bmc::BmcErrorKind::MediaAuthRefused(_)),
        "{e}"
    );
    assert!(!e.to_string().contains(&password), "{e}");
    assert!(e.to_string().contains("[redacted]"), "{e}");
    assert_eq!(
        refusing.refused.load(Ordering::SeqCst),
        2,
        "both forms asked"
    );
    iso.stop(true).await;
    refusing.handle.stop(true).await;
}

#[actix_rt::test]
async fn secure_boot_is_read_and_set_as_the_host_asks_before_the_boot_s_reset() {
    let sushy = Sushy::start(&["node-1", "node-2"], "admin", PASSWORD);
    let bmcs = Bmcs::new(&config(Duration::from_secs(20)));
    let secure_boot = |i: usize| {
        let sushy = &sushy;
        async move {
            get(
                sushy,
                &format!("/redfish/v1/Systems/{}/SecureBoot", Sushy::uuid(i)),
            )
            .await
        }
    };
    // What the BMC says goes into the facts.
    let facts = redfish::system(&bmcs, "node-1", &sushy.bmc(0))
        .await
        .unwrap()
        .facts
        .secure_boot
        .expect("the emulator's SecureBoot read");
    assert_eq!(facts.enable, Some(false));
    assert_eq!(facts.current_boot.as_deref(), Some("Disabled"));
    assert_eq!(facts.mode.as_deref(), Some("DeployedMode"));
    assert_eq!(facts.to_string(), "off (this boot: Disabled, DeployedMode)");

    // A host that wants it on: set after the boot override, before the
    // reset that starts the boot (an emulator resetting it with the boot
    // mode would otherwise undo it), and said in the boot's account.
    let mut bmc = sushy.bmc(0);
    bmc.secure_boot = Some(true);
    let (url, iso) = serve_iso("boot-sb.iso");
    let boot = redfish::boot_from_media(&bmcs, "node-1", &bmc, &url)
        .await
        .unwrap();
    assert_eq!(boot.reset, "Secure Boot set on, then ForceRestart");
    assert_eq!(secure_boot(0).await["SecureBootEnable"], true);
    let log = sushy.log();
    let at = |what: &str| {
        log.lines()
            .position(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no {what} in {log}"))
    };
    let override_at = log
        .lines()
        .position(|l| l.contains("PATCH") && l.contains(&format!("Systems/{} ", Sushy::uuid(0))))
        .unwrap_or_else(|| panic!("no boot override in {log}"));
    let secure_at = at(&format!(
        "PATCH /redfish/v1/Systems/{}/SecureBoot",
        Sushy::uuid(0)
    ));
    assert!(
        override_at < secure_at && secure_at < at("ComputerSystem.Reset"),
        "{log}"
    );
    // Already on: nothing set, no word of it.
    let boot = redfish::boot_from_network(&bmcs, "node-1", &bmc)
        .await
        .unwrap();
    assert_eq!(boot, "ForceRestart");
    // Off, through a network boot; the other system left alone.
    bmc.secure_boot = Some(false);
    let boot = redfish::boot_from_network(&bmcs, "node-1", &bmc)
        .await
        .unwrap();
    assert_eq!(boot, "Secure Boot set off, then ForceRestart");
    assert_eq!(secure_boot(0).await["SecureBootEnable"], false);
    assert_eq!(secure_boot(1).await["SecureBootEnable"], false);
    // Unset: left as it is.
    bmc.secure_boot = None;
    assert_eq!(
        redfish::boot_from_network(&bmcs, "node-1", &bmc)
            .await
            .unwrap(),
        "ForceRestart"
    );
    // A restart from the disk asked for it (a tenant's plan), over the
    // host's unset: set before that reset too.
    let reset = redfish::boot_from_disk(&bmcs, "node-1", &bmc, false, Some(true))
        .await
        .unwrap();
    assert_eq!(reset, "Secure Boot set on, then ForceRestart");
    assert_eq!(secure_boot(0).await["SecureBootEnable"], true);
    // And left on by the next boot, which asks for nothing.
    assert_eq!(
        redfish::boot_from_network(&bmcs, "node-1", &bmc)
            .await
            .unwrap(),
        "ForceRestart"
    );
    assert_eq!(secure_boot(0).await["SecureBootEnable"], true);
    iso.stop(true).await;
}
