// Client::progress(): an idle client's pass over its links (client.h). A process may hold two
// clients of one job (the fusion engine's data and probe groups): when a reducer dies, one of
// them may wait for the other workers' failover exchange while this one, idle, is not driven by
// any call. Its pass reads the loss or the reducer's ERROR Failover and joins the exchange
// (Recovery::after_pass -> recover(), which works with no round in flight, as at a start()).
#include "client/client.h"
#include "client/recovery.h"

namespace rs::client {

void Client::progress() {
  std::unique_lock<std::mutex> lk(mu_);
  if (callers_ > 0 || links_.empty()) return;  // a call drives it, or no session
  Driving driving(this);
  recovery_->check_probes();
  pump(nullptr, true);
}

}  // namespace rs::client
