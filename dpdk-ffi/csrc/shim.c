/* Exported wrappers for DPDK's static inline fast path (see shim.h). */
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_pause.h>
#include <rte_prefetch.h>
#include "shim.h"

int ainftp_errno(void) { return rte_errno; }

uint16_t ainftp_rx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n)
{
	return rte_eth_rx_burst(port, queue, pkts, n);
}

uint16_t ainftp_tx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n)
{
	return rte_eth_tx_burst(port, queue, pkts, n);
}

struct rte_mbuf *ainftp_pktmbuf_alloc(struct rte_mempool *mp) { return rte_pktmbuf_alloc(mp); }

int ainftp_pktmbuf_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs, unsigned n)
{
	return rte_pktmbuf_alloc_bulk(mp, mbufs, n);
}

void ainftp_pktmbuf_free(struct rte_mbuf *m) { rte_pktmbuf_free(m); }
void *ainftp_pktmbuf_mtod(struct rte_mbuf *m) { return rte_pktmbuf_mtod(m, void *); }
uint16_t ainftp_pktmbuf_headroom(const struct rte_mbuf *m) { return rte_pktmbuf_headroom(m); }
uint16_t ainftp_pktmbuf_tailroom(const struct rte_mbuf *m) { return rte_pktmbuf_tailroom(m); }
uint32_t ainftp_mbuf_rss_hash(const struct rte_mbuf *m) { return m->hash.rss; }
uint32_t ainftp_mbuf_packet_type(const struct rte_mbuf *m) { return m->packet_type; }
void ainftp_mbuf_set_tx_offload(struct rte_mbuf *m, uint16_t l2_len, uint16_t l3_len, uint64_t flags)
{
    m->l2_len = l2_len;
    m->l3_len = l3_len;
    m->ol_flags |= flags;
}

unsigned ainftp_ring_enqueue_burst(struct rte_ring *r, void *const *objs, unsigned n)
{
	return rte_ring_enqueue_burst(r, objs, n, NULL);
}

unsigned ainftp_ring_dequeue_burst(struct rte_ring *r, void **objs, unsigned n)
{
	return rte_ring_dequeue_burst(r, objs, n, NULL);
}

unsigned ainftp_ring_count(const struct rte_ring *r) { return rte_ring_count(r); }

unsigned ainftp_lcore_id(void) { return rte_lcore_id(); }
void ainftp_pause(void) { rte_pause(); }
void ainftp_prefetch0(const void *p) { rte_prefetch0(p); }

const uint64_t AINFTP_ETH_RSS_IPV4 = RTE_ETH_RSS_IPV4;
const uint64_t AINFTP_ETH_RSS_NONFRAG_IPV4_UDP = RTE_ETH_RSS_NONFRAG_IPV4_UDP;
const uint64_t AINFTP_ETH_MQ_RX_RSS = RTE_ETH_MQ_RX_RSS;
const uint64_t AINFTP_ETH_TX_OFFLOAD_IPV4_CKSUM = RTE_ETH_TX_OFFLOAD_IPV4_CKSUM;
const uint64_t AINFTP_ETH_TX_OFFLOAD_UDP_CKSUM = RTE_ETH_TX_OFFLOAD_UDP_CKSUM;
const uint64_t AINFTP_ETH_TX_OFFLOAD_MBUF_FAST_FREE = RTE_ETH_TX_OFFLOAD_MBUF_FAST_FREE;
const uint64_t AINFTP_ETH_RX_OFFLOAD_IPV4_CKSUM = RTE_ETH_RX_OFFLOAD_IPV4_CKSUM;
const uint64_t AINFTP_ETH_RX_OFFLOAD_UDP_CKSUM = RTE_ETH_RX_OFFLOAD_UDP_CKSUM;
const uint64_t AINFTP_ETH_RX_OFFLOAD_RSS_HASH = RTE_ETH_RX_OFFLOAD_RSS_HASH;
const uint64_t AINFTP_MBUF_F_RX_RSS_HASH = RTE_MBUF_F_RX_RSS_HASH;
const uint64_t AINFTP_MBUF_F_TX_IPV4 = RTE_MBUF_F_TX_IPV4;
const uint64_t AINFTP_MBUF_F_TX_IP_CKSUM = RTE_MBUF_F_TX_IP_CKSUM;
const uint64_t AINFTP_MBUF_F_TX_UDP_CKSUM = RTE_MBUF_F_TX_UDP_CKSUM;
const uint64_t AINFTP_MBUF_F_RX_IP_CKSUM_MASK = RTE_MBUF_F_RX_IP_CKSUM_MASK;
const uint64_t AINFTP_MBUF_F_RX_IP_CKSUM_GOOD = RTE_MBUF_F_RX_IP_CKSUM_GOOD;
const uint64_t AINFTP_MBUF_F_RX_IP_CKSUM_BAD = RTE_MBUF_F_RX_IP_CKSUM_BAD;
const uint64_t AINFTP_MBUF_F_RX_L4_CKSUM_MASK = RTE_MBUF_F_RX_L4_CKSUM_MASK;
const uint64_t AINFTP_MBUF_F_RX_L4_CKSUM_GOOD = RTE_MBUF_F_RX_L4_CKSUM_GOOD;
const uint64_t AINFTP_MBUF_F_RX_L4_CKSUM_BAD = RTE_MBUF_F_RX_L4_CKSUM_BAD;
const uint32_t AINFTP_ETH_LINK_UP = RTE_ETH_LINK_UP;
