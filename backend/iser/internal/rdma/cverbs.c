//go:build cgo && linux && !nordma

// C side of the verbs layer: turns the compact request structs (cverbs.h) into verbs calls.
#include "cverbs.h"

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sys/socket.h>



int isb_post_send(struct ibv_qp *qp, struct isb_send *s, int n) {
	struct ibv_send_wr wr[ISB_MAX_BATCH], *bad = NULL;
	struct ibv_sge sg[ISB_MAX_BATCH * 2];
	if (n <= 0 || n > ISB_MAX_BATCH) return -EINVAL;
	memset(wr, 0, sizeof(wr[0]) * n);
	for (int i = 0; i < n; i++) {
		if (s[i].nsge > 2) return -EINVAL;
		for (uint32_t j = 0; j < s[i].nsge; j++) {
			sg[i*2+j].addr = s[i].sge[j].addr;
			sg[i*2+j].length = s[i].sge[j].length;
			sg[i*2+j].lkey = s[i].sge[j].lkey;
		}
		wr[i].wr_id = s[i].wr_id;
		wr[i].sg_list = &sg[i*2];
		wr[i].num_sge = s[i].nsge;
		wr[i].opcode = (enum ibv_wr_opcode)s[i].opcode;
		wr[i].send_flags = s[i].signaled ? IBV_SEND_SIGNALED : 0;
		if (wr[i].opcode == IBV_WR_RDMA_WRITE || wr[i].opcode == IBV_WR_RDMA_READ) {
			wr[i].wr.rdma.remote_addr = s[i].remote_addr;
			wr[i].wr.rdma.rkey = s[i].rkey;
		}
		wr[i].next = (i + 1 < n) ? &wr[i+1] : NULL;
	}
	int r = ibv_post_send(qp, wr, &bad);
	return r ? -r : 0;
}

int isb_post_recv(struct ibv_qp *qp, struct isb_recv *s, int n) {
	struct ibv_recv_wr wr[ISB_MAX_BATCH], *bad = NULL;
	struct ibv_sge sg[ISB_MAX_BATCH];
	if (n <= 0 || n > ISB_MAX_BATCH) return -EINVAL;
	for (int i = 0; i < n; i++) {
		sg[i].addr = s[i].sge.addr;
		sg[i].length = s[i].sge.length;
		sg[i].lkey = s[i].sge.lkey;
		wr[i].wr_id = s[i].wr_id;
		wr[i].sg_list = &sg[i];
		wr[i].num_sge = 1;
		wr[i].next = (i + 1 < n) ? &wr[i+1] : NULL;
	}
	int r = ibv_post_recv(qp, wr, &bad);
	return r ? -r : 0;
}

int isb_poll_cq(struct ibv_cq *cq, struct isb_wc *out, int n) {
	struct ibv_wc wc[ISB_MAX_BATCH];
	if (n > ISB_MAX_BATCH) n = ISB_MAX_BATCH;
	int r = ibv_poll_cq(cq, n, wc);
	for (int i = 0; i < r; i++) {
		out[i].wr_id = wc[i].wr_id;
		out[i].status = wc[i].status;
		out[i].opcode = wc[i].opcode;
		out[i].byte_len = wc[i].byte_len;
		out[i].vendor_err = wc[i].vendor_err;
	}
	return r;
}

// isb_get_cq_event consumes one completion-channel event (non-blocking channel) and acknowledges
// it at once, so that ibv_destroy_cq never waits for unacknowledged events. 1: got one, 0: none.
int isb_get_cq_event(struct ibv_comp_channel *ch) {
	struct ibv_cq *cq; void *ctx;
	if (ibv_get_cq_event(ch, &cq, &ctx)) {
		if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
		return -errno;
	}
	ibv_ack_cq_events(cq, 1);
	return 1;
}


// isb_get_cm_event copies what we need out of one CM event and acknowledges it (private data is
// only valid until the ack). 1: got one, 0: none (EAGAIN), <0: -errno.
int isb_get_cm_event(struct rdma_event_channel *ch, struct isb_cmev *out) {
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(ch, &ev)) {
		if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
		return -errno;
	}
	memset(out, 0, sizeof(*out));
	out->type = ev->event;
	out->status = ev->status;
	out->id = ev->id;
	out->listen_id = ev->listen_id;
	if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST || ev->event == RDMA_CM_EVENT_ESTABLISHED ||
	    ev->event == RDMA_CM_EVENT_REJECTED) {
		const struct rdma_conn_param *p = &ev->param.conn;
		out->responder_resources = p->responder_resources;
		out->initiator_depth = p->initiator_depth;
		if (p->private_data && p->private_data_len) {
			out->pdlen = p->private_data_len > sizeof(out->pd) ? sizeof(out->pd) : p->private_data_len;
			memcpy(out->pd, p->private_data, out->pdlen);
		}
	}
	rdma_ack_cm_event(ev);
	return 1;
}

int isb_set_nonblock(int fd) {
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0) return -errno;
	if (fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) return -errno;
	return 0;
}

// isb_sockaddr builds a sockaddr for a 4- or 16-byte address (already resolved in Go).
static socklen_t isb_sockaddr(struct sockaddr_storage *ss, const uint8_t *ip, int iplen, int port) {
	memset(ss, 0, sizeof(*ss));
	if (iplen == 4) {
		struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
		s4->sin_family = AF_INET;
		s4->sin_port = htons(port);
		memcpy(&s4->sin_addr, ip, 4);
		return sizeof(*s4);
	}
	struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
	s6->sin6_family = AF_INET6;
	s6->sin6_port = htons(port);
	memcpy(&s6->sin6_addr, ip, 16);
	return sizeof(*s6);
}

// isb_resolve_addr starts address resolution (RDMA_CM_EVENT_ADDR_RESOLVED or ADDR_ERROR follows).
int isb_resolve_addr(struct rdma_cm_id *id, const uint8_t *ip, int iplen, int port, int timeout_ms) {
	struct sockaddr_storage ss;
	isb_sockaddr(&ss, ip, iplen, port);
	return rdma_resolve_addr(id, NULL, (struct sockaddr *)&ss, timeout_ms) ? -errno : 0;
}

int isb_bind_listen(struct rdma_cm_id *id, const uint8_t *ip, int iplen, int port, int backlog) {
	struct sockaddr_storage ss;
	isb_sockaddr(&ss, ip, iplen, port);
	if (rdma_bind_addr(id, (struct sockaddr *)&ss)) return -errno;
	if (rdma_listen(id, backlog)) return -errno;
	return 0;
}

int isb_local_port(struct rdma_cm_id *id) {
	return ntohs(rdma_get_src_port(id));
}

int isb_connect(struct rdma_cm_id *id, const void *pd, int pdlen, int resp, int init, int accept) {
	struct rdma_conn_param p;
	memset(&p, 0, sizeof(p));
	p.private_data = pd;
	p.private_data_len = pdlen;
	p.responder_resources = resp;
	p.initiator_depth = init;
	p.retry_count = 7;
	p.rnr_retry_count = 7;
	int r = accept ? rdma_accept(id, &p) : rdma_connect(id, &p);
	return r ? -errno : 0;
}

int isb_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_cq *cq,
                         int send_wr, int recv_wr, int send_sge, int recv_sge) {
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof(a));
	a.send_cq = cq;
	a.recv_cq = cq;
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = send_wr;
	a.cap.max_recv_wr = recv_wr;
	a.cap.max_send_sge = send_sge;
	a.cap.max_recv_sge = recv_sge;
	a.sq_sig_all = 0;
	return rdma_create_qp(id, pd, &a) ? -errno : 0;
}

struct ibv_mr *isb_reg_mr(struct ibv_pd *pd, uint64_t addr, size_t len, int access, int *err) {
	struct ibv_mr *mr = ibv_reg_mr(pd, (void *)(uintptr_t)addr, len, access);
	*err = mr ? 0 : errno;
	return mr;
}

int isb_max_qp_rd_atom(struct ibv_context *ctx, int *init_rd) {
	struct ibv_device_attr a;
	if (ibv_query_device(ctx, &a)) return -errno;
	*init_rd = a.max_qp_init_rd_atom;
	return a.max_qp_rd_atom;
}

// isb_set_ack_timeout sets the local ACK timeout exponent (4.096 us * 2^exp) of the connection.
// Set before route resolution, rdma_cm also uses it as the RoCE packet lifetime it announces in
// the connect request, from which the peer derives its own QP's ACK timeout.
int isb_set_ack_timeout(struct rdma_cm_id *id, uint8_t exp) {
	return rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &exp, sizeof(exp)) ? -errno : 0;
}

// isb_qp_timeout returns the QP's local ACK timeout exponent, or -errno.
int isb_qp_timeout(struct ibv_qp *qp) {
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	if (ibv_query_qp(qp, &a, IBV_QP_TIMEOUT, &ia)) return -errno;
	return a.timeout;
}
