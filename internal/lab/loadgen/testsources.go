package loadgen

// TestSourcesYAML is a sources file with one source per driver the load
// generator supports, the hmac one GitHub-style with an id header and a
// second, base64 one without, and a second Zoop source authenticated by a
// query token. It is the one fixture the load generator's tests and the
// envelope decoder's tests (which wrap these sources' payloads as ingest
// does) both read, so that a new driver or option is added to both at once.
const TestSourcesYAML = `
sources:
  - name: sw
    driver: standardwebhooks
    secrets: ["whpk_11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]
  - name: st
    driver: stripe
    secrets: ["whsec_stripe_test_4eC39HqLyjWDarjtT1zdp7dc"]
  - name: hm
    driver: hmac
    secrets: ["hmac-secret-7f3a"]
    options: {header: X-Hub-Signature-256, algorithm: sha256, prefix: "sha256=", encoding: hex, id_header: X-GitHub-Delivery}
  - name: hm64
    driver: hmac
    secrets: ["hmac-secret-91bc"]
    options: {header: X-Signature, algorithm: sha512, encoding: base64}
  - name: pm
    driver: pagarme
    secrets: ["sk_test_pagarme_0123456789"]
  - name: as
    driver: asaas
    secrets: ["asaas-token-5d2c"]
  - name: pb
    driver: pagbank
    secrets: ["5F2A3D4E-0B1C-4D2E-9F8A-7B6C5D4E3F2A"]
  - name: mp
    driver: mercadopago
    secrets: ["mp-webhook-secret-8e1f"]
  - name: zp
    driver: zoop
    secrets: ["paystream:zoop-webhook-password-5d2c"]
    options: {marketplace_id: 3249465a7753536b62545a6a684b0000}
  - name: zpq
    driver: zoop
    secrets: ["zoop-query-token-0123456789"]
    options: {marketplace_id: 3249465a7753536b62545a6a684b0000, auth: query, query_param: t}
`
