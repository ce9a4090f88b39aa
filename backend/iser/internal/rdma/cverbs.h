// cverbs.h: structures shared by the Go and C sides of the verbs layer.
#ifndef ISB_CVERBS_H
#define ISB_CVERBS_H
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <stdint.h>
#include <stddef.h>

// Work requests and completions cross the cgo boundary in these compact structs, which live in C
// memory owned by a Conn (never in the Go heap): Go fills them, C turns them into verbs structs on
// its own stack and posts them as one chain.
struct isb_sge { uint64_t addr; uint32_t length; uint32_t lkey; };
struct isb_send {
	uint64_t wr_id;
	uint64_t remote_addr;
	uint32_t opcode;
	uint32_t signaled;
	uint32_t rkey;
	uint32_t nsge;
	struct isb_sge sge[2];
};
struct isb_recv { uint64_t wr_id; struct isb_sge sge; };
struct isb_wc { uint64_t wr_id; uint32_t status; uint32_t opcode; uint32_t byte_len; uint32_t vendor_err; };

struct isb_cmev {
	int type;
	int status;
	struct rdma_cm_id *id;
	struct rdma_cm_id *listen_id;
	uint8_t responder_resources;
	uint8_t initiator_depth;
	uint8_t pdlen;
	uint8_t pd[64];
};

#define ISB_MAX_BATCH 64

int isb_post_send(struct ibv_qp *qp, struct isb_send *s, int n);
int isb_post_recv(struct ibv_qp *qp, struct isb_recv *s, int n);
int isb_poll_cq(struct ibv_cq *cq, struct isb_wc *out, int n);
int isb_get_cq_event(struct ibv_comp_channel *ch);
int isb_get_cm_event(struct rdma_event_channel *ch, struct isb_cmev *out);
int isb_set_nonblock(int fd);
int isb_resolve_addr(struct rdma_cm_id *id, const uint8_t *ip, int iplen, int port, int timeout_ms);
int isb_bind_listen(struct rdma_cm_id *id, const uint8_t *ip, int iplen, int port, int backlog);
int isb_local_port(struct rdma_cm_id *id);
int isb_connect(struct rdma_cm_id *id, const void *pd, int pdlen, int resp, int init, int accept);
int isb_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_cq *cq,
                  int send_wr, int recv_wr, int send_sge, int recv_sge);
struct ibv_mr *isb_reg_mr(struct ibv_pd *pd, uint64_t addr, size_t len, int access, int *err);
int isb_max_qp_rd_atom(struct ibv_context *ctx, int *init_rd);
int isb_set_ack_timeout(struct rdma_cm_id *id, uint8_t exp);
int isb_qp_timeout(struct ibv_qp *qp);
#endif
