#include "server/conn.h"

namespace rs::server {

OutItem& OutQueue::push() {
  if (count_ == items_.size()) grow();
  OutItem& it = items_[(head_ + count_) % items_.size()];
  it.hdr_len = 0;
  it.payload = nullptr;
  it.payload_len = 0;
  it.sent = 0;
  it.slot = nullptr;
  it.ctl.clear();
  ++count_;
  return it;
}

void OutQueue::pop() {
  head_ = (head_ + 1) % items_.size();
  --count_;
}

void OutQueue::grow() {
  std::vector<OutItem> bigger(items_.size() * 2);
  for (size_t i = 0; i < count_; ++i) bigger[i] = std::move(items_[(head_ + i) % items_.size()]);
  items_ = std::move(bigger);
  head_ = 0;
}

}  // namespace rs::server
