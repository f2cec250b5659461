package cluster

import (
	"context"
	"crypto/tls"
	"encoding/pem"
	"fmt"
	"net/url"
	"time"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/controller/certificates/rootcacertpublisher"
	"k8s.io/kubernetes/pkg/controller/daemon"
	serviceaccountcontroller "k8s.io/kubernetes/pkg/controller/serviceaccount"
)

// StartNodeControllers runs, until ctx ends, the parts of
// kube-controller-manager a real kubelet's pods need besides
// StartControllers':
//   - daemonset: the Helm chart's DaemonSet gets its pod per node.
//   - serviceaccount: the default ServiceAccount in every namespace
//     (ServiceAccount admission rejects pods without it).
//   - root-ca-cert-publisher: kube-root-ca.crt in every namespace, the CA
//     that projected service account volumes carry (the API server's).
//
// It returns when the informers have synced.
func StartNodeControllers(ctx context.Context, cp *ControlPlane) error {
	logger := klog.LoggerWithName(klog.FromContext(ctx), "controllers")
	named := func(name string) context.Context {
		return klog.NewContext(ctx, klog.LoggerWithName(logger, name))
	}
	informerClient, err := cp.componentClient("rdma-dra-node-informers")
	if err != nil {
		return err
	}
	factory := informers.NewSharedInformerFactory(informerClient, 0)

	dsClient, err := cp.componentClient("daemon-set-controller")
	if err != nil {
		return err
	}
	dsc, err := daemon.NewDaemonSetsController(named("daemonset"),
		factory.Apps().V1().DaemonSets(),
		factory.Apps().V1().ControllerRevisions(),
		factory.Core().V1().Pods(),
		factory.Core().V1().Nodes(),
		dsClient,
		flowcontrol.NewBackOff(1*time.Second, 15*time.Minute),
	)
	if err != nil {
		return fmt.Errorf("daemonset controller: %w", err)
	}

	saClient, err := cp.componentClient("service-account-controller")
	if err != nil {
		return err
	}
	sac, err := serviceaccountcontroller.NewServiceAccountsController(klog.LoggerWithName(logger, "serviceaccount"),
		factory.Core().V1().ServiceAccounts(), factory.Core().V1().Namespaces(),
		saClient, serviceaccountcontroller.DefaultServiceAccountsControllerOptions())
	if err != nil {
		return fmt.Errorf("serviceaccount controller: %w", err)
	}

	caClient, err := cp.componentClient("root-ca-cert-publisher")
	if err != nil {
		return err
	}
	ca, err := cp.ServingCA()
	if err != nil {
		return fmt.Errorf("root-ca-cert-publisher: %w", err)
	}
	pub, err := rootcacertpublisher.NewPublisher(factory.Core().V1().ConfigMaps(), factory.Core().V1().Namespaces(), caClient, ca)
	if err != nil {
		return fmt.Errorf("root-ca-cert-publisher: %w", err)
	}

	factory.Start(ctx.Done())
	go func() {
		<-ctx.Done()
		factory.Shutdown()
	}()
	go dsc.Run(named("daemonset"), 2)
	go sac.Run(named("serviceaccount"), 1)
	go pub.Run(named("root-ca-cert-publisher"), 1)

	syncCtx, cancel := context.WithTimeout(ctx, componentTimeout)
	defer cancel()
	for typ, ok := range factory.WaitForCacheSync(syncCtx.Done()) {
		if !ok {
			return fmt.Errorf("node controllers: informer for %v did not sync", typ)
		}
	}
	return nil
}

// ServingCA returns, PEM-encoded, the CA of the certificate the API server
// serves on its address (not cp.Config's CA, which is the loopback
// client's): what a kubelet or a pod's in-cluster client verifies against.
func (cp *ControlPlane) ServingCA() ([]byte, error) {
	u, err := url.Parse(cp.Config.Host)
	if err != nil {
		return nil, err
	}
	conn, err := tls.Dial("tcp", u.Host, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // reading the chain, not trusting it
	if err != nil {
		return nil, fmt.Errorf("reading the API server's certificate: %w", err)
	}
	defer conn.Close()
	chain := conn.ConnectionState().PeerCertificates
	if len(chain) == 0 {
		return nil, fmt.Errorf("the API server at %s sent no certificate", u.Host)
	}
	// The chain ends with its CA (or is a self-signed certificate).
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: chain[len(chain)-1].Raw}), nil
}
