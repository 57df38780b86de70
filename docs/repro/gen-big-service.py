#!/usr/bin/env python3
import sys
n=int(sys.argv[1])
out=["apiVersion: v1\nkind: Service\nmetadata: {name: big, namespace: big}\nspec:\n  clusterIP: 10.96.5.5\n  ports:\n  - {name: tcp, port: 80, targetPort: 8080, protocol: TCP}\n"]
for i,start in enumerate(range(0,n,100)):
    s="---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: big-%d\n  namespace: big\n  labels: {kubernetes.io/service-name: big}\naddressType: IPv4\nports:\n- {name: tcp, port: 8080, protocol: TCP}\nendpoints:\n"%i
    for k in range(start,min(start+100,n)):
        s+="- addresses: [10.%d.%d.%d]\n  conditions: {ready: true}\n"%(128+k//65536,(k//256)%256,k%256)
    out.append(s)
print("".join(out))
