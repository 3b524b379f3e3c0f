package simulate

import "fmt"

// The made-up credentials of LabSources' refetching sources: the fake
// gateway API's token (Mercado Pago and the generic convention), and the
// Zoop marketplace and API key.
const (
	labGatewayToken    = "simulate-test-api-token"
	labZoopMarketplace = "3249465a7753536b62545a6a684b0000"
	labZoopKey         = "zpk_simulate_test_key_0123456789"
)

// LabSources is a sources file with one source per driver the simulator
// speaks, with made-up secrets, for a private pipeline that the
// simulation drives (the chaos suite, this package's tests). The Mercado
// Pago and Zoop sources refetch from the fake gateway API at gatewayAddr
// (Config.GatewayListener's address), at up to 2,000 requests a second
// so that refetching does not hold the pipeline back.
func LabSources(gatewayAddr string) []byte {
	return fmt.Appendf(nil, `sources:
  - name: sw
    driver: standardwebhooks
    secrets: ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]
  - name: st
    driver: stripe
    secrets: ["whsec_simulate_stripe_5n3Kq8vT"]
  - name: hm
    driver: hmac
    secrets: ["simulate-hmac-secret-2c9e"]
    options: {header: X-Hub-Signature-256, algorithm: sha256, prefix: "sha256=", encoding: hex, id_header: X-GitHub-Delivery}
  - name: pm
    driver: pagarme
    secrets: ["sk_test_simulate_pagarme_4471"]
  - name: as
    driver: asaas
    secrets: ["simulate-asaas-token-7e21"]
  - name: pb
    driver: pagbank
    secrets: ["SIMULATE-PAGBANK-TOKEN-0A1B2C3D"]
  - name: mp
    driver: mercadopago
    secrets: ["simulate-mp-secret-93f0"]
    api_token: %[2]s
    api_base_url: http://%[1]s
    refetch_rate: 2000
  - name: zp
    driver: zoop
    account: %[3]s
    secrets: ["simulate:zoop-webhook-password-4c1d"]
    api_token: %[4]s
    api_base_url: http://%[1]s
    refetch_rate: 2000
`, gatewayAddr, labGatewayToken, labZoopMarketplace, labZoopKey)
}
