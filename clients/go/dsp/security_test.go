package dsp_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
	"google.golang.org/grpc/codes"
)

const token = "s3cret-token-for-tests"

// exercise uses every kind of call and stream: a session, a dynamic provider,
// a listener, a change stream and an assembly.
func exercise(t *testing.T, client *dsp.Client) {
	t.Helper()
	changes := must[*dsp.ChangeStream](t)(client.WatchChanges(bg))
	defer changes.Close()
	must[*dsp.Handle[string]](t)(client.SectionFunc(bg, "rules", 1, func(context.Context, dsp.AssembleContext) (string, error) {
		return "Dynamic over a secured stream.", nil
	}))
	must[*dsp.Registration](t)(client.OnAssemble(bg, func(_ context.Context, a *dsp.Assembly, _ dsp.AssembleContext, next *dsp.Next) (*dsp.Assembly, error) {
		return next.Tail(a)
	}))
	equal(t, names(must[*dsp.Assembly](t)(client.Assemble(bg)).Sections), []string{"rules"})
	nextEvent(t, changes)
}

func TestTheBearerTokenIsRequiredAndOpensEverything(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	check(t, os.WriteFile(path, []byte(token+"\n"), 0o600))
	s := startSidecar(t, nil, "--auth-token-file", path)
	_, err := dsp.Connect(bg, s.address)
	if failure(t, err).Code != codes.Unauthenticated {
		t.Fatalf("without a token: %v", err)
	}
	_, err = dsp.Connect(bg, s.address, dsp.WithToken("not-the-token"))
	if failed := failure(t, err); failed.Code != codes.Unauthenticated || !strings.Contains(failed.Message, "bearer token") {
		t.Fatalf("a wrong token: %+v", failed)
	}
	exercise(t, connect(t, s, dsp.WithToken(token)))
}

func TestTLSAndMutualTLSWithAClientCertificate(t *testing.T) {
	pki := newPKI(t)
	s := startSidecar(t, nil, "--tls-cert", pki.file("server.pem"), "--tls-key", pki.file("server.key"),
		"--tls-client-ca", pki.file("ca.pem"))
	address := strings.Replace(s.address, "127.0.0.1", "localhost", 1)
	_, err := dsp.Connect(bg, address, dsp.WithTLS(&tls.Config{RootCAs: pki.roots}), dsp.WithCallTimeout(3*time.Second))
	if failure(t, err).Code != codes.Unavailable {
		t.Fatalf("without a client certificate: %v", err)
	}
	client := must[*dsp.Client](t)(dsp.Connect(bg, address, dsp.WithTLS(&tls.Config{
		RootCAs: pki.roots, Certificates: []tls.Certificate{pki.client},
	})))
	defer client.Close()
	exercise(t, client)
}

// pki is a throwaway CA with a server certificate for localhost and a client one.
type pki struct {
	folder string
	roots  *x509.CertPool
	client tls.Certificate
}

func (p *pki) file(name string) string { return filepath.Join(p.folder, name) }

func newPKI(t *testing.T) *pki {
	t.Helper()
	p := &pki{folder: t.TempDir(), roots: x509.NewCertPool()}
	caKey := must[*ecdsa.PrivateKey](t)(ecdsa.GenerateKey(elliptic.P256(), rand.Reader))
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test-ca"}, IsCA: true,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(48 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true,
	}
	caDER := must[[]byte](t)(x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey))
	caCert := must[*x509.Certificate](t)(x509.ParseCertificate(caDER))
	p.roots.AddCert(caCert)
	p.write(t, "ca.pem", "CERTIFICATE", caDER)
	issue := func(name string, serial int64, usage x509.ExtKeyUsage) tls.Certificate {
		key := must[*ecdsa.PrivateKey](t)(ecdsa.GenerateKey(elliptic.P256(), rand.Reader))
		template := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(48 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		}
		der := must[[]byte](t)(x509.CreateCertificate(rand.Reader, template, caCert, &key.PublicKey, caKey))
		keyDER := must[[]byte](t)(x509.MarshalPKCS8PrivateKey(key))
		p.write(t, name+".pem", "CERTIFICATE", der)
		p.write(t, name+".key", "PRIVATE KEY", keyDER)
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	}
	issue("server", 2, x509.ExtKeyUsageServerAuth)
	p.client = issue("client", 3, x509.ExtKeyUsageClientAuth)
	return p
}

func (p *pki) write(t *testing.T, name, kind string, der []byte) {
	t.Helper()
	check(t, os.WriteFile(p.file(name), pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600))
}
