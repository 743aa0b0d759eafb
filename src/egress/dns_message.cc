#include "egress/dns_message.h"

#include <algorithm>

#include "egress/host_name.h"

namespace moat::egress {
namespace {

constexpr size_t kHeaderSize = 12;
constexpr size_t kMaxNameWire = 255;
constexpr size_t kARecordSize = 2 + 2 + 2 + 4 + 2 + 4;  // pointer type class ttl rdlength rdata
// The question name always starts right after the header.
constexpr uint16_t kPointerToQuestion = 0xC000 | kHeaderSize;

// Header flag bits (RFC 1035 4.1.1): byte 2 is QR|Opcode(4)|AA|TC|RD,
// byte 3 is RA|Z|AD|CD|RCODE(4).
constexpr uint8_t kFlagQr = 0x80;
constexpr uint8_t kFlagRd = 0x01;
constexpr uint8_t kFlagRa = 0x80;

unsigned u16At(std::string_view data, size_t i) { return byteAt(data, i) << 8 | byteAt(data, i + 1); }

void putU16(std::string& out, unsigned v) {
  out.push_back(static_cast<char>(v >> 8 & 0xff));
  out.push_back(static_cast<char>(v & 0xff));
}
void putU32(std::string& out, uint32_t v) {
  putU16(out, v >> 16);
  putU16(out, v & 0xffff);
}

Error malformed(const std::string& what) { return Error::make(Code::kInvalidArgument, "dns query: " + what); }

bool isLabelChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

// The name in wire form. Names from parseDnsQuery encode unchanged; for any
// other string empty labels are dropped and long ones cut, so the output is
// always a well-formed name.
std::string encodeName(std::string_view name) {
  std::string out;
  while (!name.empty()) {
    size_t dot = name.find('.');
    std::string_view label = name.substr(0, dot);
    name = dot == std::string_view::npos ? std::string_view() : name.substr(dot + 1);
    if (label.empty()) continue;
    if (label.size() > kMaxLabel) label = label.substr(0, kMaxLabel);
    if (out.size() + 1 + label.size() + 1 > kMaxNameWire) break;
    out.push_back(static_cast<char>(label.size()));
    out.append(label);
  }
  out.push_back('\0');
  return out;
}

// Header and question of a response to q.
std::string responseStart(const DnsQuery& q, int rcode, uint16_t answerCount) {
  std::string out;
  putU16(out, q.id);
  out.push_back(static_cast<char>(kFlagQr | (q.recursionDesired ? kFlagRd : 0)));
  out.push_back(static_cast<char>(kFlagRa | (rcode & 0x0f)));
  putU16(out, 1);  // qdcount
  putU16(out, answerCount);
  putU16(out, 0);  // nscount
  putU16(out, 0);  // arcount
  out.append(encodeName(q.name));
  putU16(out, q.type);
  putU16(out, q.qclass);
  return out;
}

}  // namespace

Result<DnsQuery> parseDnsQuery(std::string_view packet) {
  if (packet.size() < kHeaderSize) {
    return malformed(std::to_string(packet.size()) + " bytes, shorter than a header");
  }
  unsigned flags = byteAt(packet, 2);
  if (flags & kFlagQr) return malformed("QR set (a response, not a query)");
  unsigned opcode = flags >> 3 & 0x0f;
  if (opcode != 0) return malformed("opcode " + std::to_string(opcode) + " is not QUERY");
  unsigned questions = u16At(packet, 4);
  if (questions != 1) return malformed(std::to_string(questions) + " questions, expected 1");

  DnsQuery q;
  q.id = static_cast<uint16_t>(u16At(packet, 0));
  q.recursionDesired = (flags & kFlagRd) != 0;
  size_t pos = kHeaderSize;
  for (;;) {
    if (pos >= packet.size()) return malformed("question name truncated");
    unsigned length = byteAt(packet, pos++);
    if (length == 0) break;
    if ((length & 0xc0) == 0xc0) return malformed("compression pointer in the question");
    if (length & 0xc0) return malformed("extended label type");
    if (packet.size() - pos < length) return malformed("question name truncated");
    std::string_view label = packet.substr(pos, length);
    pos += length;
    for (char c : label) {
      if (!isLabelChar(c)) return malformed("byte " + std::to_string(c & 0xff) + " in a label");
    }
    size_t textSize = q.name.size() + (q.name.empty() ? 0 : 1) + label.size();
    if (textSize > kMaxHostName) return malformed("name longer than 253 characters");
    if (!q.name.empty()) q.name.push_back('.');
    for (char c : label) q.name.push_back(c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c);
  }
  if (packet.size() - pos < 4) return malformed("question type and class truncated");
  q.type = static_cast<uint16_t>(u16At(packet, pos));
  q.qclass = static_cast<uint16_t>(u16At(packet, pos + 2));
  return q;
}

std::string dnsAnswer(const DnsQuery& q, const std::vector<uint32_t>& ipv4NetworkOrder, uint32_t ttl) {
  size_t fixed = kHeaderSize + encodeName(q.name).size() + 4;
  size_t room = fixed < kDnsMaxUdpMessage ? (kDnsMaxUdpMessage - fixed) / kARecordSize : 0;
  size_t count = std::min(ipv4NetworkOrder.size(), room);
  std::string out = responseStart(q, kDnsNoError, static_cast<uint16_t>(count));
  for (size_t i = 0; i < count; ++i) {
    putU16(out, kPointerToQuestion);
    putU16(out, kDnsTypeA);
    putU16(out, kDnsClassIN);
    putU32(out, ttl);
    putU16(out, 4);
    // Already in network order: copy the bytes as they lie in memory.
    const char* bytes = reinterpret_cast<const char*>(&ipv4NetworkOrder[i]);
    out.append(bytes, 4);
  }
  return out;
}

std::string dnsError(const DnsQuery& q, int rcode) { return responseStart(q, rcode, 0); }

std::optional<std::string> dnsFormatErrorFor(std::string_view packet) {
  if (packet.size() < kHeaderSize) return std::nullopt;
  unsigned flags = byteAt(packet, 2);
  if (flags & kFlagQr) return std::nullopt;
  unsigned opcode = flags >> 3 & 0x0f;
  std::string out(packet.substr(0, 2));  // id
  out.push_back(static_cast<char>(kFlagQr | (flags & 0x78) | (flags & kFlagRd)));
  out.push_back(static_cast<char>(kFlagRa | (opcode == 0 ? kDnsFormErr : kDnsNotImp)));
  out.append(8, '\0');  // no question, no records
  return out;
}

std::string dnsTcpFrame(std::string_view message) {
  if (message.size() > 0xffff) return {};
  std::string out;
  out.reserve(2 + message.size());
  putU16(out, static_cast<unsigned>(message.size()));
  out.append(message);
  return out;
}

std::optional<std::string_view> dnsTcpNextMessage(std::string_view buffer, size_t* consumed) {
  if (buffer.size() < 2) return std::nullopt;
  size_t length = u16At(buffer, 0);
  if (buffer.size() - 2 < length) return std::nullopt;
  *consumed = 2 + length;
  return buffer.substr(2, length);
}

}  // namespace moat::egress
