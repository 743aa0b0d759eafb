#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

// The DNS wire format (RFC 1035 4), as much as the egress stub resolver
// needs: it reads one question from an environment and answers it with A
// records, an empty answer or an error. Queries come from inside a sandbox;
// parsing reads nothing past the packet and allocates at most a name.
namespace moat::egress {

constexpr uint16_t kDnsTypeA = 1;
constexpr uint16_t kDnsTypeAAAA = 28;
constexpr uint16_t kDnsClassIN = 1;

constexpr int kDnsNoError = 0;
constexpr int kDnsFormErr = 1;
constexpr int kDnsServFail = 2;
constexpr int kDnsNxDomain = 3;
constexpr int kDnsNotImp = 4;
constexpr int kDnsRefused = 5;

// Answers built here stay within the classic UDP limit.
constexpr size_t kDnsMaxUdpMessage = 512;

struct DnsQuery {
  uint16_t id = 0;
  std::string name;  // lower-case, no trailing dot; "" for the root
  uint16_t type = 0;
  uint16_t qclass = 0;
  bool recursionDesired = false;
};

// Parses a query: QR=0, opcode 0 (QUERY), exactly one question, whose name
// has labels of 1..63 bytes of [A-Za-z0-9_-], at most 253 characters as
// text, and no compression pointer. Records after the question (an EDNS
// OPT, say) are ignored. Errors have code "malformed".
Result<DnsQuery> parseDnsQuery(std::string_view packet);

// A NOERROR response: the question echoed, then one A record per address
// (network byte order), each naming the question through a compression
// pointer. No addresses is NOERROR with an empty answer, the reply for a
// name that exists but has no record of the queried type (e.g. AAAA). The
// records are always type A, so pass addresses only for A queries.
// Addresses beyond what fits kDnsMaxUdpMessage are left out.
std::string dnsAnswer(const DnsQuery& q, const std::vector<uint32_t>& ipv4NetworkOrder, uint32_t ttl);

// A response with rcode (e.g. kDnsNxDomain, kDnsRefused) and the question
// echoed, no records.
std::string dnsError(const DnsQuery& q, int rcode);

// The reply to a packet parseDnsQuery refused: FORMERR (NOTIMP for an opcode
// other than QUERY) with the packet's id and RD and no question. Nothing
// when there is no whole 12-byte header to take the id from, or when the
// packet is itself a response (QR=1): answering those could start a loop.
std::optional<std::string> dnsFormatErrorFor(std::string_view packet);

// DNS over TCP (RFC 1035 4.2.2): each message carries a 2-byte length prefix.
// dnsTcpFrame returns "" for a message over 65535 bytes.
std::string dnsTcpFrame(std::string_view message);
// The first whole message in a TCP stream buffer, and in *consumed the
// bytes it took with its prefix; nothing while the message is incomplete.
std::optional<std::string_view> dnsTcpNextMessage(std::string_view buffer, size_t* consumed);

}  // namespace moat::egress
