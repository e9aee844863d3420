/*
 * The DPDK fast path is made of static inline functions that have no symbol
 * to link against. This shim gives each one we use an exported name; the
 * constants defined with function-like macros (RTE_BIT64) get one too,
 * because bindgen cannot evaluate them.
 */
#ifndef AINFTP_SHIM_H
#define AINFTP_SHIM_H

#include <stdint.h>
#include <rte_mbuf.h>
#include <rte_ring.h>

int ainftp_errno(void);

uint16_t ainftp_rx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n);
uint16_t ainftp_tx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n);

struct rte_mbuf *ainftp_pktmbuf_alloc(struct rte_mempool *mp);
int ainftp_pktmbuf_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs, unsigned n);
void ainftp_pktmbuf_free(struct rte_mbuf *m);
void *ainftp_pktmbuf_mtod(struct rte_mbuf *m);
uint16_t ainftp_pktmbuf_headroom(const struct rte_mbuf *m);
uint16_t ainftp_pktmbuf_tailroom(const struct rte_mbuf *m);
uint32_t ainftp_mbuf_rss_hash(const struct rte_mbuf *m);
uint32_t ainftp_mbuf_packet_type(const struct rte_mbuf *m);
void ainftp_mbuf_set_tx_offload(struct rte_mbuf *m, uint16_t l2_len, uint16_t l3_len, uint64_t flags);

unsigned ainftp_ring_enqueue_burst(struct rte_ring *r, void *const *objs, unsigned n);
unsigned ainftp_ring_dequeue_burst(struct rte_ring *r, void **objs, unsigned n);
unsigned ainftp_ring_count(const struct rte_ring *r);

unsigned ainftp_lcore_id(void);
void ainftp_pause(void);
void ainftp_prefetch0(const void *p);

extern const uint64_t AINFTP_ETH_RSS_IPV4;
extern const uint64_t AINFTP_ETH_RSS_NONFRAG_IPV4_UDP;
extern const uint64_t AINFTP_ETH_MQ_RX_RSS;
extern const uint64_t AINFTP_ETH_TX_OFFLOAD_IPV4_CKSUM;
extern const uint64_t AINFTP_ETH_TX_OFFLOAD_UDP_CKSUM;
extern const uint64_t AINFTP_ETH_TX_OFFLOAD_MBUF_FAST_FREE;
extern const uint64_t AINFTP_ETH_RX_OFFLOAD_IPV4_CKSUM;
extern const uint64_t AINFTP_ETH_RX_OFFLOAD_UDP_CKSUM;
extern const uint64_t AINFTP_ETH_RX_OFFLOAD_RSS_HASH;
extern const uint64_t AINFTP_MBUF_F_RX_RSS_HASH;
extern const uint64_t AINFTP_MBUF_F_TX_IPV4;
extern const uint64_t AINFTP_MBUF_F_TX_IP_CKSUM;
extern const uint64_t AINFTP_MBUF_F_TX_UDP_CKSUM;
extern const uint64_t AINFTP_MBUF_F_RX_IP_CKSUM_MASK;
extern const uint64_t AINFTP_MBUF_F_RX_IP_CKSUM_GOOD;
extern const uint64_t AINFTP_MBUF_F_RX_IP_CKSUM_BAD;
extern const uint64_t AINFTP_MBUF_F_RX_L4_CKSUM_MASK;
extern const uint64_t AINFTP_MBUF_F_RX_L4_CKSUM_GOOD;
extern const uint64_t AINFTP_MBUF_F_RX_L4_CKSUM_BAD;
extern const uint32_t AINFTP_ETH_LINK_UP;

#endif
