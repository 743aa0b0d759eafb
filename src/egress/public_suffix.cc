#include "egress/public_suffix.h"

#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>

#include "os/file.h"

namespace moat::egress {
namespace {

constexpr char kDebianList[] = "/usr/share/publicsuffix/public_suffix_list.dat";

// Punycode's parameters (RFC 3492, section 5).
constexpr uint32_t kBase = 36, kTmin = 1, kTmax = 26, kSkew = 38, kDamp = 700, kInitialBias = 72;
constexpr char32_t kInitialN = 0x80;

// UTF-8 to code points; false for bytes that are not UTF-8.
bool decodeUtf8(std::string_view s, std::u32string& out) {
  for (size_t i = 0; i < s.size();) {
    auto b = static_cast<unsigned char>(s[i]);
    size_t n = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xe ? 3 : (b >> 3) == 0x1e ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    char32_t c = n == 1 ? b : n == 2 ? (b & 0x1f) : n == 3 ? (b & 0x0f) : (b & 0x07);
    for (size_t k = 1; k < n; ++k) {
      auto cont = static_cast<unsigned char>(s[i + k]);
      if ((cont >> 6) != 0x2) return false;
      c = (c << 6) | (cont & 0x3f);
    }
    static constexpr char32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < kMin[n] || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) return false;
    out.push_back(c);
    i += n;
  }
  return true;
}

// RFC 3492's bias adaptation.
uint32_t adapt(uint32_t delta, uint32_t points, bool first) {
  delta = first ? delta / kDamp : delta / 2;
  delta += delta / points;
  uint32_t k = 0;
  while (delta > ((kBase - kTmin) * kTmax) / 2) {
    delta /= kBase - kTmin;
    k += kBase;
  }
  return k + (kBase - kTmin + 1) * delta / (delta + kSkew);
}

// The rule's labels in ASCII, dot-separated; "" when one is not UTF-8.
std::string asciiDomain(std::string_view rule) {
  std::string out;
  size_t start = 0;
  while (start <= rule.size()) {
    size_t end = rule.find('.', start);
    if (end == std::string_view::npos) end = rule.size();
    std::string label = asciiLabel(rule.substr(start, end - start));
    if (label.empty()) return "";
    if (!out.empty()) out += '.';
    out += label;
    start = end + 1;
  }
  return out;
}

}  // namespace

std::string asciiLabel(std::string_view utf8) {
  std::u32string points;
  if (!decodeUtf8(utf8, points)) return "";
  std::string out;
  for (char32_t c : points) {
    if (c < 0x80) out += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  }
  if (out.size() == points.size()) return out;
  // Punycode (RFC 3492): the basic code points, "-", then the others as
  // generalized variable-length integers.
  const uint32_t basic = static_cast<uint32_t>(out.size());
  if (basic > 0) out += '-';
  auto digit = [](uint32_t d) { return static_cast<char>(d < 26 ? 'a' + d : '0' + d - 26); };
  uint32_t n = kInitialN, delta = 0, bias = kInitialBias, handled = basic;
  while (handled < points.size()) {
    char32_t next = 0x10ffff + 1;
    for (char32_t c : points) {
      if (c >= n && c < next) next = c;
    }
    // A label is at most 63 bytes: these never come near overflowing.
    delta += (next - n) * (handled + 1);
    n = next;
    for (char32_t c : points) {
      if (c < n) ++delta;
      if (c != n) continue;
      uint32_t q = delta;
      for (uint32_t k = kBase;; k += kBase) {
        uint32_t t = k <= bias ? kTmin : k >= bias + kTmax ? kTmax : k - bias;
        if (q < t) break;
        out += digit(t + (q - t) % (kBase - t));
        q = (q - t) / (kBase - t);
      }
      out += digit(q);
      bias = adapt(delta, handled + 1, handled == basic);
      delta = 0;
      ++handled;
    }
    ++delta;
    ++n;
  }
  return "xn--" + out;
}

PublicSuffixList PublicSuffixList::parse(std::string_view text) {
  PublicSuffixList list;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    start = end + 1;
    // A rule is the line's first word.
    size_t cut = line.find_first_of(" \t\r");
    if (cut != std::string_view::npos) line = line.substr(0, cut);
    if (line.empty() || line.rfind("//", 0) == 0) continue;
    bool exception = line[0] == '!';
    bool wildcard = line.rfind("*.", 0) == 0;
    std::string domain = asciiDomain(line.substr(exception ? 1 : wildcard ? 2 : 0));
    if (domain.empty()) continue;
    ++list.rules_;
    if (exception) {
      list.exception_.insert(domain);
      continue;
    }
    (wildcard ? list.wildcard_ : list.exact_).insert(domain);
    // Every name above the suffix holds it ("*.ck": ck itself too).
    const std::string example = wildcard ? "*." + domain : domain;
    if (wildcard) list.below_.emplace(domain, example);
    for (size_t dot = domain.find('.'); dot != std::string::npos; dot = domain.find('.', dot + 1)) {
      list.below_.emplace(domain.substr(dot + 1), example);
    }
  }
  return list;
}

Result<PublicSuffixList> PublicSuffixList::load(const std::string& path) {
  MOAT_ASSIGN(std::string text, os::readFile(path));
  PublicSuffixList list = parse(text);
  if (list.size() == 0) return Error::make(Code::kInvalidArgument, path + " holds no public suffix rules");
  return list;
}

bool PublicSuffixList::isPublicSuffix(const std::string& domain) const {
  if (exception_.count(domain)) return false;
  if (exact_.count(domain)) return true;
  size_t dot = domain.find('.');
  if (dot == std::string::npos) return true;
  return wildcard_.count(domain.substr(dot + 1)) > 0;
}

std::string PublicSuffixList::suffixBelow(const std::string& domain) const {
  auto it = below_.find(domain);
  return it == below_.end() ? "" : it->second;
}

const Result<PublicSuffixList>& systemPublicSuffixes() {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<Result<PublicSuffixList>>> loaded;
  const char* env = std::getenv("MOAT_PUBLIC_SUFFIX_LIST");
  const std::string path = env && *env ? env : kDebianList;
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = loaded[path];
  if (!slot) {
    auto list = PublicSuffixList::load(path);
    slot = std::make_unique<Result<PublicSuffixList>>(
        list.ok() ? std::move(list)
                  : Result<PublicSuffixList>(Error::make(
                        Code::kUnavailable, "the public suffix list " + path + " cannot be read (" +
                                                list.error().message() + "; Debian's package publicsuffix has it)")));
  }
  return *slot;
}

}  // namespace moat::egress
